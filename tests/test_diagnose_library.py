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
    # the engine's spans are joined to the requests an openai+ load sends
    ({"duration": 1, "otlp_listen": ":4318"}, ["--duration", "1s", "--otlp-listen", ":4318"],
     "--otlp-listen needs an openai+http:// TARGET: the spans are joined to the requests "
     "the load sends"),
    ({"duration": 1, "otlp_wait": "9s"}, ["--duration", "1s", "--otlp-wait", "9s"],
     "--otlp-wait needs --otlp-listen"),
    # bench's outputs that diagnose does not write are refused, never dropped
    ({"duration": 1, "rate": 10, "hdr": "run.hdr"},
     ["--duration", "1s", "--rate", "10", "--hdr", "run.hdr"],
     "--hdr: diagnose writes no HdrHistogram log (bench does); --log FILE keeps the run's "
     "per-request log"),
    ({"duration": 1, "rate": 10, "hdr_interval": "2s"},
     ["--duration", "1s", "--rate", "10", "--hdr-interval", "2s"],
     "--hdr-interval: diagnose writes no HdrHistogram log (bench does); --log FILE keeps "
     "the run's per-request log"),
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
    logged = DiagnoseSpec.of("http://127.0.0.1:9/", pid=os.getpid(), rate=50, duration=2,
                             log="/tmp/requests.csv")
    assert logged.bench is not None and logged.bench.options.log == "/tmp/requests.csv"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.bin_s = 1.0  # type: ignore[misc]
    passive = DiagnoseSpec.of(pid=os.getpid(), duration=1)
    assert passive.bench is None and passive.target is None


def test_otlp_listen_stamps_each_request_with_the_id_its_span_names():
    """--otlp-listen: loopback unless told, and the load sends request i of the run as
    X-Request-Id request_uuid(run, i) (the id vLLM names its span by); a bad address or a
    second X-Request-Id is refused."""
    from tailgate.diagnose import DiagnoseSpec
    from tailgate.errors import UsageError
    from tailgate.sources.otlp import request_number, request_uuid

    llm = {"pid": os.getpid(), "model": "m", "rate": 10, "duration": 1}
    spec = DiagnoseSpec.of("openai+http://127.0.0.1:9/v1", otlp_listen=":0", **llm)
    o = spec.otlp
    assert (o.host, o.port, o.wait_s) == ("127.0.0.1", 0, 6.0)
    reqs = spec.bench.engine_fields["requests"]
    assert len(reqs) == 10
    for i, req in enumerate(reqs):
        line, second = req.split(b"\r\n")[:2]
        assert line.startswith(b"POST /v1/completions HTTP/1.1")
        assert second == b"X-Request-Id: " + request_uuid(o.run, i).encode()
        assert request_number(second.split(b": ")[1].decode(), o.run) == i
    assert "X-Request-Id" not in str(DiagnoseSpec.of("openai+http://127.0.0.1:9/v1",
                                                     **llm).bench.engine_fields["requests"])
    assert DiagnoseSpec.of("openai+http://127.0.0.1:9/v1", otlp_listen="0.0.0.0:4318",
                           **llm).otlp.host == "0.0.0.0"
    for bad, message in ((":99999", "--otlp-listen ':99999': give HOST:PORT (a port 0-65535)"),
                         ("host:", "--otlp-listen 'host:': give HOST:PORT (a port 0-65535)")):
        with pytest.raises(UsageError) as exc:
            DiagnoseSpec.of("openai+http://127.0.0.1:9/v1", otlp_listen=bad, **llm)
        assert str(exc.value) == message
    with pytest.raises(UsageError, match="^--otlp-listen sends each request's own"):
        DiagnoseSpec.of("openai+http://127.0.0.1:9/v1", otlp_listen=":0",
                        header=["x-request-id: 7"], **llm)


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


@pytest.mark.parametrize("name", ["X-Request-Id", "traceparent", "TraceParent"])
def test_otlp_listen_refuses_a_header_it_sends_itself(name):
    """--otlp-listen names each request by its own X-Request-Id and traceparent: a user's
    header of either name would be sent beside it, so it is refused, named as given."""
    from tailgate.diagnose import DiagnoseSpec
    from tailgate.errors import UsageError

    with pytest.raises(UsageError) as exc:
        DiagnoseSpec.of("openai+http://127.0.0.1:9/v1", pid=os.getpid(), duration=1,
                        rate=1, model="m", otlp_listen="127.0.0.1:0",
                        header=[f"{name}: 00-1"])
    assert str(exc.value) == (f"--otlp-listen sends each request's own X-Request-Id and "
                              f"traceparent: not with --header {name}")
