"""Peak RSS of the generator against a server whose every response is one 15 MB event.

The scripted OpenAI-compatible server (tests/support/llm_server.py, mode ``big_event``)
answers each request with a single server-sent event of 15 MB (data lines of 1,000,000
bytes, the JSON's padding: under the 1 MiB line limit and the 16 MiB event limit) and
``data: [DONE]``, keep-alive, every connection's response written at once. ``tailgate bench
--workers 1`` runs at each rate on each engine in a process of its own; its peak RSS is
``os.wait4``'s ``ru_maxrss``. What a run holds is bounded by docs/bench.md ("Memory a run
holds"): connections with an event in progress hold up to the event limit each, the others
64 KiB a buffer; so the peak follows how many responses are in progress at once (the
``max_open`` column), which grows with the rate when the machine cannot keep up.

Run: ``.venv/bin/python benchmarks/bench_big_events.py [--rates 10,25,50] [--duration 2]
[--src DIR]`` (``--src``: the tailgate source tree to run, e.g. an older build, for a
before/after comparison in the same conditions). On a shared 2-core VM other processes
change how many responses are in flight; every figure comes with its command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.llm_server import ScriptedServer  # noqa: E402


def run(base: str, engine: str, rate: float, duration: float, src: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="tailgate-big-") as tmp:
        out = Path(tmp, "r.json")
        cmd = [sys.executable, "-m", "tailgate", "bench", "openai+" + base, "--model", "m",
               "--engine", engine, "--rate", f"{rate:g}", "--duration", f"{duration:g}s",
               "--workers", "1", "--timeout", "20s", "--quiet", "--json", str(out)]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": src})
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)}: {proc.stderr.read().decode()[-2000:]}")
        data = json.loads(out.read_text())
    req = data["requests"]
    return {"engine": engine, "rate": rate, "rss_mib": usage.ru_maxrss / 1024,
            "sent": req["sent"], "ok": req["ok"],
            "errors": {k: v for k, v in req["errors"].items() if v},
            "max_open": data["connections"]["max_open"], "wall_s": time.monotonic() - t0,
            "command": " ".join(cmd[1:-2])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="10,25,50")
    ap.add_argument("--engines", default="fast,python")
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--src", default=str(REPO / "src"))
    a = ap.parse_args()
    with ScriptedServer(modes=("big_event",), keep_alive=True, serial_big=False) as srv:
        print(f"server: {srv.base} (big_event, keep-alive, concurrent); src {a.src}")
        print("engine  rate/s  peak RSS MiB  sent  ok  errors  max_open  wall s")
        for rate in (float(r) for r in a.rates.split(",")):
            for engine in a.engines.split(","):
                r = run(srv.base, engine, rate, a.duration, a.src)
                print(f"{engine:6s}  {rate:6g}  {r['rss_mib']:12.0f}  {r['sent']:4d}  "
                      f"{r['ok']:3d}  {r['errors'] or '-'}  {r['max_open']:8d}  "
                      f"{r['wall_s']:6.1f}", flush=True)
        print(f"command: {r['command']} --json FILE")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
