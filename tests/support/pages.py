"""Every HTML page kind, made the way a user makes it: the tailgate CLI against real servers
(nginx, llama-cpp-python's OpenAI server), this host's kernel and the fixture roots. Shared by
tests/test_html_browser.py and tests/support/screenshots.py; each function writes
``NAME.html`` and ``NAME.json`` (where the command has one) into a folder and returns their
paths."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tailgate.history import MIN_WINDOW_S

TAILGATE = [sys.executable, "-m", "tailgate"]
ROOTS = Path(__file__).resolve().parents[1] / "fixtures" / "roots"
PLAN = Path(__file__).resolve().parents[1] / "fixtures" / "plan"


def tailgate(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TAILGATE, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def _ok(out: subprocess.CompletedProcess[str], codes: tuple[int, ...] = (0,)) -> None:
    if out.returncode not in codes:
        raise RuntimeError(f"exit {out.returncode}: {out.args}\n{out.stderr[-3000:]}")


@contextlib.contextmanager
def stopping(pid: int, after_s: float, every_s: float | None = None,
             for_s: float = 0.3) -> Iterator[None]:
    """SIGSTOP ``pid`` for ``for_s`` after ``after_s`` (and every ``every_s`` after that, when
    given) while the block runs: a real stall of the server."""
    stop = threading.Event()

    def loop() -> None:
        if stop.wait(after_s):
            return
        while True:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(for_s)
            os.kill(pid, signal.SIGCONT)
            if every_s is None or stop.wait(every_s - for_s):
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        os.kill(pid, signal.SIGCONT)


def bench(d: Path, name: str, url: str, *extra: str, rate: str = "500",
          duration: str = "1s") -> tuple[Path, Path]:
    html, doc = d / f"{name}.html", d / f"{name}.json"
    _ok(tailgate("bench", url, "--rate", rate, "--duration", duration, "--workers", "1",
                 "--quiet", "--json", str(doc), "--html", str(html), *extra))
    return html, doc


def bench_stalled(d: Path, name: str, ng) -> tuple[Path, Path]:
    """A 4 s bench at 1000/s in which nginx's worker is stopped for 0.3 s, 3 s after the
    command starts (inside the measured window, about a second in)."""
    (pid,) = ng.worker_pids()
    with stopping(pid, after_s=3.0):
        return bench(d, name, ng.url("/"), rate="1000", duration="4s")


def llm_bench(d: Path, name: str, base: str, model: str) -> tuple[Path, Path]:
    """openai+ against a real streaming server; an SLO makes goodput a figure of its own."""
    html, doc = d / f"{name}.html", d / f"{name}.json"
    _ok(tailgate("bench", f"openai+{base}", "--model", model, "--rate", "6", "--requests", "24",
                 "--input-len", "16", "--output-len", "12", "--slo", "ttft_p99<60s",
                 "--quiet", "--json", str(doc), "--html", str(html)), (0, 1))
    return html, doc


def compare(d: Path, name: str, a: Path, b: Path) -> Path:
    html = d / f"{name}.html"
    _ok(tailgate("compare", str(a), str(b), "--html", str(html), "--quiet"), (0, 1))
    return html


def inspect_host(d: Path, name: str, *extra: str) -> tuple[Path, Path]:
    html, doc = d / f"{name}.html", d / f"{name}.json"
    _ok(tailgate("inspect", "--interval", "0", "--no-history", "--quiet", "--json", str(doc),
                 "--html", str(html), *extra), (0, 1))
    return html, doc


def inspect_root(d: Path, name: str, scenario: str) -> tuple[Path, Path]:
    """A bare-metal fixture root inspected twice (the counters need two samples), the
    second time after ``scenario``'s files were copied over the clean root."""
    root, state = d / f"{name}-root", d / f"{name}-state"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(ROOTS / "l1l3-clean", root, symlinks=True)
    _ok(tailgate("inspect", "--root", str(root), "--state", str(state), "--interval", "0",
                 "--quiet"), (0, 1))
    shutil.copytree(ROOTS / f"l1l3-{scenario}", root, dirs_exist_ok=True)
    # A rate needs a window of at least MIN_WINDOW_S: on a quiet machine the two runs came
    # under it (a fresh root's last minutes), the counters were `unknown` and L1 not first.
    time.sleep(MIN_WINDOW_S)
    html, doc = d / f"{name}.html", d / f"{name}.json"
    _ok(tailgate("inspect", "--root", str(root), "--state", str(state), "--interval", "0",
                 "--quiet", "--json", str(doc), "--html", str(html)), (0, 1))
    return html, doc


def diagnose_stopped(d: Path, name: str, ng) -> tuple[Path, Path]:
    """diagnose against nginx while its worker is stopped 50 ms every 0.5 s."""
    (pid,) = ng.worker_pids()
    html, doc = d / f"{name}.html", d / f"{name}.json"
    with stopping(pid, after_s=1.5, every_s=0.5, for_s=0.05):
        out = tailgate("diagnose", ng.url("/"), "--pid", str(pid), "--rate", "500",
                       "--duration", "3s", "--workers", "1", "--html", str(html),
                       "--json", str(doc))
    _ok(out, (0, 1))
    return html, doc


def plan_prefix_cache(d: Path, name: str) -> Path:
    html = d / f"{name}.html"
    trace = Path(__file__).resolve().parents[1] / "fixtures" / "llm" / "mooncake_synthetic_trace.jsonl.gz"
    _ok(tailgate("plan", "prefix-cache", str(trace), "--kv-config",
                 str(PLAN / "configs" / "llama-3.1-8b.json"), "--hbm", "300GB", "--dram",
                 "600GB", "--curve", "6", "--html", str(html)), (0, 1))
    return html


def sweep(d: Path, name: str, url: str) -> Path:
    html = d / f"{name}.html"
    _ok(tailgate("bench", url, "--sweep", "200..2000", "--sweep-steps", "3", "--sweep-bisect",
                 "0", "--duration", "1s", "--workers", "1", "--slo", "p99<500ms", "--quiet",
                 "--sweep-html", str(html)), (0, 1))
    return html
