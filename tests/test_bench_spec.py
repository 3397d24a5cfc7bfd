"""The bench core as a library (issue 23): BenchOptions mirror the command line, a
BenchSpec is checked once and runs from Python, and a protocol is one registered module."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from support.nginx import Nginx, available
from support.require import require
from tailgate.bench import BenchOptions, BenchSpec, run
from tailgate.bench import protocols as registry
from tailgate.bench.outcome import KINDS
from tailgate.commands.bench import add_load_options, add_request_options
from tailgate.errors import UsageError

pytestmark = pytest.mark.timeout(120)


def bench_parser_defaults() -> dict[str, object]:
    p = argparse.ArgumentParser(add_help=False)
    add_load_options(p)
    add_request_options(p)
    return {a.dest: a.default for a in p._actions}


def test_options_are_the_command_lines_with_its_defaults():
    parser = bench_parser_defaults()
    mine = BenchOptions.defaults()
    assert set(mine) - {"target", "confidence"} == set(parser)
    for name, default in parser.items():  # lists on the command line, tuples here
        assert mine[name] == (tuple(default) if isinstance(default, list) else default), name


def test_a_spec_is_checked_once_and_frozen():
    spec = BenchSpec.of("tcp://127.0.0.1:7/", rate=100, duration=2, payload="PING\\r\\n",
                        delimiter="\\r\\n", slo=["p99<5ms"])
    assert (spec.info.rate, spec.info.duration_s, spec.target.request) == (
        100.0, 2.0, b"PING\r\n")
    assert spec.protocol == "tcp" and spec.target.delimiter == b"\r\n"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.info = None  # type: ignore[misc]
    with pytest.raises(UsageError, match="no bench option colour"):
        BenchSpec.of("http://127.0.0.1:1/", rate=1, duration=1, colour="red")
    with pytest.raises(UsageError, match="--method does not apply to tcp:// targets"):
        BenchSpec.of("tcp://127.0.0.1:7/", rate=1, duration=1, payload="x", delimiter="\\n",
                     method="POST")


def test_coalesce_is_checked_and_echoed():
    spec = BenchSpec.of("http://127.0.0.1:1/", rate=1000, duration=1, coalesce="50us",
                        engine="fast")
    assert spec.info.coalesce_s == pytest.approx(50e-6)
    assert spec.info.config_json()["coalesce_s"] == pytest.approx(50e-6)
    assert BenchSpec.of("http://127.0.0.1:1/", rate=1, duration=1).info.coalesce_s == 0.0
    with pytest.raises(UsageError, match=r"^--coalesce is the compiled engine's, and this run "
                       r"is the python engine's \(--engine python\)$"):
        BenchSpec.of("http://127.0.0.1:1/", rate=1, duration=1, coalesce="1ms",
                     engine="python")
    with pytest.raises(UsageError, match=r"^--coalesce 2s: must be >= 0 and below --timeout$"):
        BenchSpec.of("http://127.0.0.1:1/", rate=1, duration=1, coalesce="2s", timeout="2s")
    with pytest.raises(UsageError, match=r"^--coalesce does not apply to udp:// targets"):
        BenchSpec.of("udp://127.0.0.1:9/", rate=1, duration=1, coalesce="1ms")


def test_the_registry_is_where_schemes_flags_and_kinds_come_from():
    reg = registry.registry()
    assert sorted(reg) == ["grpc", "grpcs", "http", "https", "openai+http", "openai+https",
                           "tcp", "udp"]
    assert registry.compiled_schemes() == ("http", "https", "tcp", "openai+http", "openai+https")
    assert registry.flag_protocols()["--body"] == ("http", "grpc")
    assert "grpc_status" in registry.kinds_for("grpcs")
    assert "grpc_status" not in registry.kinds_for("https")
    assert "no_token" in registry.kinds_for("openai")
    for proto in registry.protocols():  # kinds are outcome names, in the outcome order
        assert [k for k in KINDS if k in proto.kinds] == list(proto.kinds), proto.kind
    with pytest.raises(UsageError, match="target must be http\\(s\\)://host:port/path, "
                                         "tcp://host:port, grpc"):
        registry.protocol_of("ftp://example/")


def test_the_library_call_runs_a_benchmark_in_three_lines():
    require(available())
    with Nginx(workers=1) as ng:
        result = run(BenchSpec.of(ng.url("/"), rate=50, duration=1, workers=1,
                                  connections=2, slo=["p50<10s", "error_rate<1%"]))
    req = result.json["requests"]
    assert (req["sent"], req["ok"]) == (50, 50), req
    assert result.passed and all(s["pass"] for s in result.json["slo"])
    assert result.json["config"]["rate"] == 50.0 and result.json["tailgate_bench"] == 1


def test_a_protocol_is_one_module(monkeypatch):
    """Redis PING added as tests/support/resp_protocol.py alone: its scheme parses, its
    flags are refused for it, and a bench against a real server counts every request."""
    from support.resp_protocol import PongServer

    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, "support.resp_protocol"))
    registry.registry.cache_clear()
    try:
        with pytest.raises(UsageError, match="--method does not apply to resp:// targets"):
            BenchSpec.of("resp://127.0.0.1:6379", rate=1, duration=1, method="POST")
        with PongServer() as srv:
            result = run(BenchSpec.of(f"resp://127.0.0.1:{srv.port}", rate=40, duration=1,
                                      workers=1, connections=1))
        req = result.json["requests"]
        assert (req["sent"], req["ok"], srv.pings) == (40, 40, 40), req
        assert set(req["errors"]) == set(registry.kinds_for("resp"))
        assert result.json["protocol"] == "resp"
    finally:
        monkeypatch.undo()
        registry.registry.cache_clear()


def test_the_readmes_python_example_runs_as_written():
    """The README's three lines, against nginx in place of its 127.0.0.1:8080."""
    import contextlib
    import io
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
               if "from tailgate.bench import" in b]
    assert len(code.strip().splitlines()) == 3, code
    require(available())
    with Nginx(workers=1) as ng:
        out = io.StringIO()
        scope: dict[str, object] = {}
        with contextlib.redirect_stdout(out):
            exec(code.replace("http://127.0.0.1:8080/", ng.url("/")), scope)  # noqa: S102
    result = scope["result"]
    p999, passed = out.getvalue().split()
    assert float(p999) == result.json["latency_ms"]["p999"]  # type: ignore[attr-defined]
    assert passed == str(result.passed)  # type: ignore[attr-defined]
    assert result.json["requests"]["scheduled"] == 25_000  # type: ignore[attr-defined]
