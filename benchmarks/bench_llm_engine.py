"""tailgate against a real engine (issue 27): the llama.cpp test server, with the peers
that time every chunk gap beside it, and the engine's own timings.

The server is the test suite's (``tests/support/llm_server.py``: llama-cpp-python serving a
tiny random-weight Llama, one thread, pinned to ``--server-cpu``). It writes its own
timings of every completion to its log (llama.cpp's ``llama_perf_context_print``): the
prompt's evaluation and the decoding, ``eval time = T ms / N runs``, one run a token after
the first. Its middleware answers 400 to an ``x-request-id`` that is not a UUID, which
every request of ``vllm bench serve`` has (``bench-<hex>-<n>``), so when vLLM runs the
server starts with that check off. Each tool runs pinned to ``--client-cpu`` at the same
Poisson rate, the tools taking turns (their order rotated every repeat); per run the
script reads the tool's own TTFT and ITL and, from the server's log of that run, the
engine's prompt time and its decode time per token.

What agrees with what:

* the tools with each other: tailgate (compiled engine), ``vllm bench serve`` and
  inference-perf all time every gap between chunks (aiperf's and guidellm's ITL is a
  per-request mean over token counts their own tokenizer makes, which is not the
  model's, so they are left out here). vLLM times TTFT to the first chunk of any kind,
  tailgate to the first with a token and reports the first chunk too
  (``first_chunk_ms``), so the table shows both (on /v1/completions llama-cpp-python's
  first chunk carries a token: the two agree);
* the tools with the engine: a client's ITL is the engine's decode time per token plus
  what the server does per token outside the engine (llama-cpp-python's Python HTTP
  stack), the same for every client; so the difference between the client's ITL and the
  engine's decode time, per tool, is the server's overhead plus the client's error.

Run: ``.venv/bin/python benchmarks/bench_llm_engine.py [--rate 4] [--duration 20]
[--repeats 3] [--tokens 32] [--tools tailgate,vllm,inference-perf] [--json out.json]``
(the peers as for ``bench_llm_peers.py``: ``--peer-python``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_llm_peers import DEFAULT_PEERS, Setup, Tool, bounded, cell, make_tokenizer, parsed, tools_wanted  # noqa: E402
from bench_llm_scale import machine  # noqa: E402

PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")


def engine_timings(log: str) -> dict:
    """The engine's own per-completion timings in a stretch of its log: percentiles of the
    prompt's evaluation (ms) and of the decode time per token (ms), and the completions."""
    prompt = [float(m.group(1)) for m in PROMPT.finditer(log)]
    per_tok = [float(m.group(1)) / int(m.group(2)) for m in EVAL.finditer(log)
               if int(m.group(2)) > 0]
    if not prompt or len(prompt) != len(per_tok):
        raise ValueError(f"the server's log has {len(prompt)} prompt and {len(per_tok)} "
                         "decode timings: not one of each per completion")

    def pct(v: list[float], q: float) -> float:
        return float(np.percentile(v, q))

    return {"engine_prompt_p50": pct(prompt, 50), "engine_prompt_p99": pct(prompt, 99),
            "engine_decode_p50": pct(per_tok, 50), "engine_decode_p99": pct(per_tok, 99),
            "engine_completions": len(prompt)}


def server_log(path: Path, start: int, completions: int, wait_s: float = 5.0) -> str:
    """The server's log from ``start``, once it holds the timings of ``completions``
    completions (it writes them after a completion's last chunk, so a moment after the
    client has it) or ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        with path.open("rb") as f:
            f.seek(start)
            log = f.read().decode(errors="replace")
        if len(EVAL.findall(log)) >= completions or time.monotonic() > deadline:
            return log
        time.sleep(0.05)


def first_chunk(run_dir: str) -> dict:
    """tailgate's TTFT to the first chunk of any kind (vLLM's definition)."""
    d = json.loads(Path(run_dir, "r.json").read_text())
    return {"first_chunk_p50": d["first_chunk_ms"]["p50"]}


def run(tool: Tool, s: Setup, port: int, log_path: Path, limit: float) -> dict:
    os.makedirs(s.run_dir, exist_ok=True)
    start = log_path.stat().st_size
    out: dict = {"tool": tool.name, "offered": s.count, "failed": None}
    rc, out["cpu_s"] = bounded(*tool.command(s, port), s.run_dir, limit)
    out.update(parsed(tool, s.run_dir, rc, limit))
    if out["failed"]:
        return out
    try:
        out.update(engine_timings(server_log(log_path, start, out["done"])))
    except ValueError as exc:  # (a tool that never reached the server, say)
        out["failed"] = str(exc)
        return out
    if tool.name == "tailgate":
        out.update(first_chunk(s.run_dir))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", default="tailgate,vllm,inference-perf")
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--client-cpu", default="0")
    ap.add_argument("--server-cpu", default="1")
    ap.add_argument("--peer-python", default=DEFAULT_PEERS)
    ap.add_argument("--run-timeout", type=float, default=120.0)
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    from support.llm_server import llama_server

    peers, tools, _ = tools_wanted(args.tools, args.peer_python)
    names = [t.name for t in tools]
    load = os.getloadavg()
    print(f"{machine(load)}; tool on CPU "
          f"{args.client_cpu}, llama.cpp server on CPU {args.server_cpu}; Poisson "
          f"{args.rate:g}/s for {args.duration:g} s, {args.tokens} tokens a completion; median "
          f"of {args.repeats} (min-max); " + ", ".join(f"{t.name} {t.version}" for t in tools))
    everything: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tailgate-engine-") as tmp:
        tok = make_tokenizer(peers, tools, os.path.join(tmp, "tokenizer"), args.tokens)
        with llama_server(tmp, cpu=args.server_cpu, any_request_id="vllm" in names) as base:
            port = urlsplit(base).port
            log_path = Path(tmp) / "llama-server.log"
            limit = args.duration + args.run_timeout
            for rep in range(args.repeats):
                k = rep % len(tools)
                for tool in tools[k:] + tools[:k]:
                    s = Setup(args.rate, args.duration, args.tokens, 0.0, args.client_cpu,
                              tok, os.path.join(tmp, f"{tool.name}-{rep}"))
                    r = run(tool, s, port, log_path, limit)
                    r["repeat"] = rep
                    everything.append(r)
                    print(f"  {tool.name} #{rep}: " + (r["failed"] or (
                        f"done {r['done']}/{s.count}, TTFT P50 {r['ttft_p50']:.2f} ms, ITL P50 "
                        f"{r['itl_p50']:.3f} ms; engine decode P50 "
                        f"{r['engine_decode_p50']:.3f} ms a token")), file=sys.stderr,
                          flush=True)
                    if args.json:
                        Path(args.json).write_text(json.dumps(
                            {"args": vars(args), "tools": {t.name: t.version for t in tools},
                             "load": load, "runs": everything}, indent=1))
    print("| tool | done / offered | TTFT P50 / P99 ms (tool's) | first chunk P50 ms | ITL P50 "
          "/ P99 ms (tool's) | engine: prompt P50 ms | engine: decode P50 / P99 ms a token "
          "| ITL P50 - engine decode P50 ms | failed runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tool in tools:
        runs = [r for r in everything if r["tool"] == tool.name]
        ok = [dict(r, done_frac=r["done"] / r["offered"],
                   over=r["itl_p50"] - r["engine_decode_p50"]) for r in runs if not r["failed"]]
        first = cell(ok, "first_chunk_p50", 3) if tool.name == "tailgate" else (
            "= TTFT" if tool.name == "vllm" else "-")
        print(f"| {tool.name} | {cell(ok, 'done_frac', 3)} | {cell(ok, 'ttft_p50', 3)} / "
              f"{cell(ok, 'ttft_p99', 3)} | {first} | {cell(ok, 'itl_p50', 3)} / "
              f"{cell(ok, 'itl_p99', 3)} | {cell(ok, 'engine_prompt_p50', 3)} | "
              f"{cell(ok, 'engine_decode_p50', 3)} / {cell(ok, 'engine_decode_p99', 3)} | "
              f"{cell(ok, 'over', 3)} | {len(runs) - len(ok)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
