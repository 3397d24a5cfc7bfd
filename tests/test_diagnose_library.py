"""diagnose as a library (issue 44): `DiagnoseSpec.of` refuses as the command line does, and
docs/diagnose.md's Python example runs as written against a real nginx whose worker is
stopped (SIGSTOP) while the probes record."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.nginx import Nginx, available
from support.require import require

pytestmark = pytest.mark.timeout(180)
DOC = Path(__file__).resolve().parents[1] / "docs" / "diagnose.md"


@pytest.fixture(autouse=True, scope="module")
def _needs_root():
    if os.geteuid() != 0:
        pytest.fail("diagnose needs root (bpftrace); CI runs as root")


@pytest.mark.parametrize("options, flags, message", [
    ({"duration": 1, "profile_hz": 99}, ["--duration", "1s", "--profile-hz", "99"],
     "--profile-hz needs --profile"),
    ({"duration": 1, "profile": True, "profile_hz": 5000},
     ["--duration", "1s", "--profile", "--profile-hz", "5000"],
     "--profile-hz must be between 1 and 4999"),
    ({"duration": 1, "bin": "0.5ms"}, ["--duration", "1s", "--bin", "0.5ms"],
     "--bin must be between 1ms and 60s"),
    ({}, [], "--duration is required"),
    # the load, checked as bench checks it, before any probe is attached
    ({"duration": 1, "rate": 10, "workers": 0}, ["--duration", "1s", "--rate", "10", "--workers", "0"],
     "--workers and --max-connections must be >= 1, --connections >= 0"),
])
def test_the_spec_refuses_as_the_command_line_does(options, flags, message):
    from tailgate.diagnose import DiagnoseSpec
    from tailgate.errors import UsageError

    with pytest.raises(UsageError) as exc:
        DiagnoseSpec.of("http://127.0.0.1:9/", pid=os.getpid(), **options)
    assert str(exc.value) == message
    out = subprocess.run([sys.executable, "-m", "tailgate", "diagnose", "http://127.0.0.1:9/",
                          "--pid", str(os.getpid()), *flags],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"tailgate diagnose: error: {message}\n", out.stderr


def test_an_unknown_keyword_is_refused():
    from tailgate.diagnose import DiagnoseSpec
    from tailgate.errors import UsageError

    with pytest.raises(UsageError, match="^no diagnose option colour$"):
        DiagnoseSpec.of("http://127.0.0.1:9/", pid=os.getpid(), duration=1, colour="red")


def test_a_spec_is_checked_once_and_frozen():
    from tailgate.diagnose import DiagnoseSpec

    spec = DiagnoseSpec.of("http://127.0.0.1:9/", pid=[os.getpid()], rate=50, duration=2,
                           bin="50ms", min_cover=0.3)
    assert spec.pids == (os.getpid(),) and spec.bin_s == 0.05 and spec.window_s == 2.0
    assert spec.options.min_cover == 0.3 and spec.target == "http://127.0.0.1:9/"
    assert spec.bench is not None and spec.bench.info.rate == 50.0
    assert spec.bench.options.json is None and spec.bench.options.quiet  # outputs are ours
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.bin_s = 1.0  # type: ignore[misc]
    passive = DiagnoseSpec.of(pid=os.getpid(), duration=1)
    assert passive.bench is None and passive.target is None


@contextlib.contextmanager
def stopping(pid: int, every_s: float = 0.5, for_s: float = 0.05):
    """Stop ``pid`` for ``for_s`` every ``every_s`` until the block ends."""
    done = threading.Event()

    def loop() -> None:
        done.wait(0.3)
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(for_s)
            os.kill(pid, signal.SIGCONT)
            done.wait(every_s - for_s)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
        os.kill(pid, signal.SIGCONT)


def test_the_docs_python_example_runs_as_written():
    """The page's three lines against nginx (its worker in place of 1234, 200 req/s for 2 s in
    place of 1k for 4 s), the worker stopped for 50 ms every 500 ms: the document is the
    command's, every stop the probe saw is in it, and the example prints from it."""
    text = DOC.read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
               if "from tailgate.diagnose import" in b]
    assert len(code.strip().splitlines()) == 3, code
    require(available())
    with Nginx(workers=1) as ng:
        (pid,) = ng.worker_pids()
        code = (code.replace("http://127.0.0.1:8080/", ng.url("/"))
                .replace("[1234]", f"[{pid}]").replace('"1k"', '"200"')
                .replace('"4s"', '"2s"'))
        out = io.StringIO()
        scope: dict[str, object] = {}
        with stopping(pid), contextlib.redirect_stdout(out):
            exec(code, scope)  # noqa: S102
    doc = scope["doc"]
    assert isinstance(doc, dict)
    assert doc["tailgate_diagnose"] == 1 and doc["mode"] == "load" and doc["pids"] == [pid]
    assert doc["bench"]["requests"]["scheduled"] == 400
    # the stops inside the window at least (one every 0.5 s over 2 s); each lasted 50 ms
    stopped = doc["evidence"]["stopped"]
    assert stopped["events"] >= 3 and stopped["total_ms"] >= 3 * 40, stopped
    assert out.getvalue() == f"{doc['verdict']['claimed']} {stopped['events']}\n"
    assert json.loads(json.dumps(doc)) == doc  # the document --json writes
