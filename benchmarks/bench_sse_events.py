"""The compiled engine's JSON side (bench/fast_sse.Streams.events) per chunk, in CPU time of
one thread: a take of usual content chunks (completions and chat, as llama-server and the
fake server send them; and completions with llama-server's timings in every chunk, as
``--engine-timings per-token`` asks for; 2,000 streams x 25 chunks) read the way the
recorder thread reads it.

    .venv/bin/python benchmarks/bench_sse_events.py [--src OTHER/src ...] [--runs 5]

Each ``--src`` (default: this checkout's) runs in its own interpreter, the checkouts taking
turns run by run; it prints the median and range of ns per chunk, beside the peer: the
standard library's ``json.loads`` of the same chunks alone (what any Python reader of them
pays before it has kept anything).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from tailgate.bench.fast_sse import EV_DATA, EVENT, Streams

def take(kind, streams, per):
    recs, blob = [], bytearray()
    for k in range(per):
        for r in range(streams):
            if kind == "timed":  # llama-server, "timings_per_token": true
                d = (b'{"choices":[{"text":" t%d","index":0,"logprobs":null,'
                     b'"finish_reason":null}],"created":1765000000,"model":"m",'
                     b'"system_fingerprint":"b1-x","object":"text_completion",'
                     b'"id":"cmpl-%d","timings":{"cache_n":0,"prompt_n":16,'
                     b'"prompt_ms":3.412,"prompt_per_token_ms":0.213,'
                     b'"prompt_per_second":4689.3,"predicted_n":%d,"predicted_ms":%d.125,'
                     b'"predicted_per_token_ms":1.02,"predicted_per_second":980.4}}'
                     % (k, r, k + 1, k))
            elif kind == "completions":
                d = b'{"id":"x","choices":[{"index":0,"text":" t%d","finish_reason":null}]}' % k
            else:
                d = (b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" tok%d"}}],'
                     b'"created":1765000000,"id":"chatcmpl-%d","model":"m",'
                     b'"system_fingerprint":"b1-x","object":"chat.completion.chunk"}' % (k, r))
            recs.append((r, 1000 + k, 100, len(blob), len(d), EV_DATA))
            blob += d
    return np.array(recs, dtype=EVENT).tobytes(), bytes(blob)

out = {}
for kind in ("completions", "chat", "timed"):
    api = "chat" if kind == "chat" else "completions"
    hdr, blob = take(kind, 2000, 25)
    s = Streams(api=api)
    t = time.thread_time_ns()
    s.events(hdr, blob, 0.0)
    out[kind] = (time.thread_time_ns() - t) / 50_000
    ev = np.frombuffer(hdr, dtype=EVENT)
    mv = memoryview(blob)
    t = time.thread_time_ns()
    for off, ln in zip(ev["off"].tolist(), ev["len"].tolist()):
        json.loads(mv[off:off + ln].tobytes())
    out["json.loads " + kind] = (time.thread_time_ns() - t) / 50_000
print(json.dumps(out))
"""


COLUMNS = ("completions", "chat", "timed", "json.loads completions", "json.loads chat",
           "json.loads timed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", action="append", type=Path,
                    help="a checkout's src directory (repeatable; default this one's)")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    srcs = a.src or [Path(__file__).resolve().parents[1] / "src"]
    got: dict[str, dict[str, list[float]]] = {str(s): {} for s in srcs}
    for _ in range(a.runs):
        for s in srcs:
            r = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(s)], check=True,
                                          capture_output=True, text=True).stdout)
            for api, ns in r.items():
                got[str(s)].setdefault(api, []).append(ns)
    print(f"ns of one thread's CPU per usual chunk, {a.runs} runs, median (min-max)")
    print("| src | completions | chat | completions, timings per token | json.loads alone: "
          "completions | chat | timed |")
    print("|---|---|---|---|---|---|---|")
    for s, by in got.items():
        cells = [f"{statistics.median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f})"
                 for v in (by[k] for k in COLUMNS)]
        print(f"| {s} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
