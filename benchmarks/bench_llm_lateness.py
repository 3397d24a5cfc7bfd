"""The LLM generator's own lateness (issue 12): how late tailgate sends each request
behind its intended start, at 4 requests/s Poisson against the llama.cpp test server
(tests/support/llm_server.py: llama-cpp-python serving a tiny random-weight GGUF).

The peer, in the same run: a plain asyncio open loop (uvloop), the usual way such a
generator is written — sleep until each request is due, then start a task that opens a
connection, sends the request and reads the stream to its end; its lateness is how late
each wake-up came. Each ``--src`` is a tailgate source tree run side by side on the same
server (e.g. this one and an older checkout, to compare before and after); per tree it
prints lateness P50 and P99 with TTFT and ITL P50 (the server's figures, for scale) and
the ratio of its P99 lateness to the peer's.

Run: ``.venv/bin/python benchmarks/bench_llm_lateness.py [--src DIR ...] [--duration 30]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def run(src: str, base: str, model: str, rate: float, duration: float, seed: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tailgate", "bench", f"openai+{base}", "--model", model,
         "--rate", str(rate), "--arrival", "poisson", "--duration", f"{duration}s",
         "--seed", str(seed), "--input-len", "16", "--output-len", "16", "--quiet",
         "--json", "-"], capture_output=True, text=True, check=False, timeout=duration + 300,
        env={**os.environ, "PYTHONPATH": src})
    if out.returncode not in (0, 1):
        raise SystemExit(f"{src}: tailgate bench failed ({out.returncode}): {out.stderr[-500:]}")
    return json.loads(out.stdout)


def peer(base: str, model: str, rate: float, duration: float, seed: int) -> list[float]:
    """The plain asyncio open loop's lateness (ms) at the same schedule."""
    import asyncio
    from urllib.parse import urlsplit

    import numpy as np
    import uvloop

    url = urlsplit(base)
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * duration * 2) + 16))
    offsets = offsets[offsets < duration]
    body = json.dumps({"model": model, "prompt": "the of and " * 5, "max_tokens": 16,
                       "stream": True}).encode()
    req = (f"POST {url.path}/completions HTTP/1.1\r\nHost: {url.hostname}:{url.port}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
           f"Connection: close\r\n\r\n").encode() + body

    async def one() -> None:
        r, w = await asyncio.open_connection(url.hostname, url.port)
        w.write(req)
        while await r.read(65536):
            pass
        w.close()

    async def run_all() -> list[float]:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.1
        late, tasks = [], []
        for off in offsets.tolist():
            await asyncio.sleep(max(0.0, start + off - loop.time()))
            late.append((loop.time() - (start + off)) * 1e3)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
        return late

    return uvloop.run(run_all())


def main() -> int:
    from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", default=[],
                    help="a tailgate src/ directory to run (repeatable; default this tree's)")
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    srcs = args.src or [str(HERE.parent / "src")]
    why = llama_cpp_available()
    if why:
        raise SystemExit(why)
    print(f"lateness at {args.rate:g} req/s Poisson for {args.duration:g} s against "
          f"llama.cpp (tiny random model), one run per tree, same server")
    with tempfile.TemporaryDirectory() as tmp, llama_server(tmp) as base:
        import numpy as np

        late = np.asarray(peer(base, MODEL_NAME, args.rate, args.duration, args.seed))
        p50, p99 = np.percentile(late, [50, 99])
        print(f"  plain asyncio open loop (peer): {late.size} requests, lateness P50 "
              f"{p50:.3f} ms, P99 {p99:.3f} ms, max {late.max():.3f} ms")
        for src in srcs:
            d = run(src, base, MODEL_NAME, args.rate, args.duration, args.seed)
            late, ttft, itl = d["lateness_ms"], d["ttft_ms"], d["itl_ms"]
            print(f"  {src}: {late['count']} requests, lateness P50 {late['p50']:.3f} ms, "
                  f"P99 {late['p99']:.3f} ms, max {late['max']:.3f} ms; TTFT P50 "
                  f"{ttft['p50']:.2f} ms, ITL P50 {itl['p50']:.2f} ms; P99 lateness "
                  f"{late['p99'] / max(p99, 1e-9):.2f}x the peer's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
