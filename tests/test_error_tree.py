"""One error tree (issue 44): every exception class tailgate defines derives from the tree in
errors.py (bad input: InputError, a UsageError with exit status 2 that is also a ValueError;
a server that broke its protocol: ProtocolError, the request's outcome), except the internal
ones listed here, each caught where it is raised and never shown as is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tailgate"
# internal: converted where they are caught (a request's outcome, a finding's reason)
INTERNAL = {
    "bench/http1.py": {"FramingError"},  # a response's framing: the request's outcome
    "bench/openai_sse.py": {"_Fail"},
    "bench/tls.py": {"DialError"},  # a connect or handshake failure: the request's outcome
    "bench/workers.py": {"WorkerFailure"},  # a worker that did not start: the runner says so
    "bench/collective/backends.py": {"BackendUnavailable"},  # -> UsageError by its caller
    "history.py": {"NoWindow"},
    "judge.py": {"Unknown"},  # a check's "cannot tell": the finding is unknown
    "schema.py": {"_Mismatch"},  # a value against its schema: refusal() returns the reason
    "errors.py": {"TailgateError"},  # the root
}
BUILTIN = {"Exception", "ValueError", "RuntimeError", "KeyError", "TypeError", "OSError"}


def _roots() -> dict[str, set[str]]:
    """Per module, the classes deriving straight from a builtin exception."""
    out: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id in BUILTIN for b in node.bases):
                out.setdefault(str(path.relative_to(SRC)), set()).add(node.name)
    return out


def test_no_exception_outside_the_tree_but_the_internal_ones():
    roots = _roots()
    assert roots.get("errors.py") == {"TailgateError", "InputError"}
    roots["errors.py"].discard("InputError")  # (UsageError, ValueError): in the tree
    assert roots == INTERNAL


@pytest.mark.parametrize("name", ["slo.SloError", "bench.target.TargetError",
                                  "bench.tls.TlsError", "compare.CompareError",
                                  "userfiles.UserFileError", "plan.kv.ModelConfigError",
                                  "plan.traces.TraceError", "plan.sweep.SweepError",
                                  "report.documents.DocumentError",
                                  "campaign.table.CampaignFileError",
                                  "bench.fastpath.EngineUnavailable",
                                  "bench.collective.nccl_tests.NcclTestsError",
                                  "hist.HistogramError"])
def test_bad_input_is_a_usage_error_and_still_a_value_error(name):
    import importlib

    from tailgate.errors import EXIT_USAGE, UsageError

    module, cls = name.rsplit(".", 1)
    err = getattr(importlib.import_module(f"tailgate.{module}"), cls)("bad")
    assert isinstance(err, UsageError) and isinstance(err, ValueError)
    assert err.exit_status == EXIT_USAGE


def test_no_value_error_class_outside_the_tree():
    """`class X(ValueError)` is written once, in errors.py (InputError): every other class a
    caller may catch as a ValueError is bad input, in the tree."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id == "ValueError" for b in node.bases):
                found.append(f"{path.relative_to(SRC)}:{node.name}")
    assert found == ["errors.py:InputError"]


@pytest.mark.parametrize("name", ["llm.sse.SSEError", "llm.sse.SSETooLarge",
                                  "llm.openai.ChunkError"])
def test_a_broken_protocol_is_the_requests_outcome_not_bad_input(name):
    """The codec's errors cross from llm/ to the load engine, which makes each one a
    request's outcome: in the tree as ProtocolError, neither a usage error nor a ValueError
    (a caller catching bad input cannot swallow them), a defect if one reached the CLI.
    That each one ends its request as malformed_sse is tests/test_openai_sse_conn.py's."""
    import importlib

    from tailgate.errors import EXIT_BUG, ProtocolError, UsageError

    module, cls = name.rsplit(".", 1)
    err = getattr(importlib.import_module(f"tailgate.{module}"), cls)("bad")
    assert isinstance(err, ProtocolError)
    assert not isinstance(err, UsageError | ValueError)
    assert err.exit_status == EXIT_BUG


def test_a_schema_mismatch_never_leaves_its_module():
    from tailgate import schema

    assert not hasattr(schema, "Mismatch")
    assert schema.refusal("cpu.count", "many") is not None
