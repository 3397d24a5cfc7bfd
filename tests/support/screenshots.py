"""Render every HTML page kind from real runs and save a PNG of each under build/screenshots/
(`make screenshots`; as root, with nginx, bpftrace, chromium and the test extra installed).

The pages themselves stay beside the PNGs under build/screenshots/pages/, to open in a
browser. build/ is ignored by git: the screenshots are build output, for a person to look at.

    python tests/support/screenshots.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

# tests/ on the path, not this folder (its inspect.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parents[1])

from support import pages  # noqa: E402
from support.browser import render, screenshot_dir  # noqa: E402

# name -> window size (tall pages get a tall window)
KINDS = {"inspect-host": "1200,3200", "inspect-baremetal": "1200,4200", "bench": "1200,2600",
         "bench-drifted": "1200,2600", "llm": "1200,5200", "compare": "1200,1800",
         "diagnose": "1200,4600", "plan-prefix-cache": "1200,900", "sweep": "1200,900"}


def make(d: Path, only: set[str]) -> dict[str, Path]:
    from support.llm_server import MODEL_NAME, llama_server
    from support.nginx import Nginx

    def want(kind: str) -> bool:
        return not only or kind in only

    out: dict[str, Path] = {}
    if want("inspect-host"):
        out["inspect-host"], _ = pages.inspect_host(d, "inspect-host", "--probe-window", "2")
    if want("inspect-baremetal"):
        out["inspect-baremetal"], _ = pages.inspect_root(d, "inspect-baremetal", "fec-grown")
    if want("plan-prefix-cache"):
        out["plan-prefix-cache"] = pages.plan_prefix_cache(d, "plan-prefix-cache")
    if only & {"bench", "bench-drifted", "compare", "diagnose", "sweep"} or not only:
        with Nginx(workers=1) as ng:
            a, a_doc = pages.bench(d, "bench", ng.url("/"))
            out["bench"] = a
            if want("compare"):
                _, b_doc = pages.bench(d, "bench-b", ng.url("/"))
                out["compare"] = pages.compare(d, "compare", a_doc, b_doc)
            if want("bench-drifted"):
                out["bench-drifted"], _ = pages.bench_stalled(d, "bench-drifted", ng)
            if want("sweep"):
                out["sweep"] = pages.sweep(d, "sweep", ng.url("/"))
            if want("diagnose"):
                out["diagnose"], _ = pages.diagnose_stopped(d, "diagnose", ng)
    if want("llm"):
        with tempfile.TemporaryDirectory() as tmp, llama_server(tmp) as base:
            out["llm"], _ = pages.llm_bench(d, "llm", base, MODEL_NAME)
    return {k: v for k, v in out.items() if want(k)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(KINDS), default=[])
    args = ap.parse_args()
    d = screenshot_dir() / "pages"
    d.mkdir(parents=True, exist_ok=True)
    made = make(d, set(args.only))
    failed = 0
    for name, page in made.items():
        r = render(page, name, size=KINDS[name])
        errors = [m for m in r.console if "error" in m.lower()]
        print(f"{r.screenshot}  ({page.stat().st_size / 1e6:.2f} MB page"
              + (f"; console: {errors}" if errors else "") + ")")
        failed += bool(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
