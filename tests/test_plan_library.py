"""plan as a library (issue 44): each spec refuses as the command line does, the document
`run(spec)` returns is the one `--json` writes, and docs/plan.md's Python example runs as
written."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plan.md"
CONFIG = "examples/deepseek-v3/config.json"
TRACE = "tests/fixtures/llm/mooncake_conversation_trace.jsonl.gz"
BENCH_JSON = "examples/compare/after.json"


def command(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", "plan", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("make, argv, message", [
    (lambda p: p.KvSpec.of(CONFIG, tp=0), ["kv", CONFIG, "--tp", "0"], "--tp 0: must be >= 1"),
    (lambda p: p.KvSpec.of(CONFIG, utilization=1.5), ["kv", CONFIG, "--utilization", "1.5"],
     "--utilization 1.5: expected a number in (0, 1]"),
    (lambda p: p.KvSpec.of("no/such.json"), ["kv", "no/such.json"],
     "cannot read no/such.json: no such config"),
    (lambda p: p.SpecdecSpec.of(), ["specdec"], "give --alpha, --metrics, --probs or --candidate"),
    (lambda p: p.SpecdecSpec.of(candidate=["bad"]), ["specdec", "--candidate", "bad"],
     "candidate 'bad': expected NAME:KIND:ALPHA:COST (e.g. eagle3:eagle:0.8:0.05)"),
    (lambda p: p.FanoutSpec.of(BENCH_JSON, hedge_after="p95"),
     ["fanout", "--from", BENCH_JSON, "--hedge-after", "p95"],
     "--hedge-after p95: the leaf is a bench JSON's percentile table (p50, p90, p99, p99.9, "
     "p99.99, max), which has no p95 (it would read as the next row up); name one of those, "
     "a time (5ms), or give a histogram (bench --hdr FILE)"),
    (lambda p: p.PrefixCacheSpec.of(TRACE, weights="1,x,2"),
     ["prefix-cache", TRACE, "--weights", "1,x,2"], "--weights 1,x,2: expected R,F,D numbers"),
    (lambda p: p.PrefixCacheSpec.of(TRACE, limit=5, hbm="40GB"),
     ["prefix-cache", TRACE, "--limit", "5", "--hbm", "40GB"],
     "--hbm 40GB: a size in bytes needs --kv-config or --bytes-per-token (or give a number of "
     "blocks)"),
])
def test_a_spec_refuses_as_the_command_line_does(make, argv, message, monkeypatch):
    import tailgate.plan as plan
    from tailgate.errors import UsageError

    monkeypatch.chdir(ROOT)
    with pytest.raises(UsageError) as exc:
        make(plan)
    assert str(exc.value) == message
    out = command(*argv)
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"tailgate plan: error: {message}\n", out.stderr


def test_an_unknown_keyword_is_refused():
    from tailgate.errors import UsageError
    from tailgate.plan import FanoutSpec

    with pytest.raises(UsageError, match="^no plan fanout option colour$"):
        FanoutSpec.of(str(ROOT / BENCH_JSON), colour="red")


@pytest.mark.parametrize("make, argv", [
    (lambda p: p.KvSpec.of(CONFIG, dtype="fp8", scale_block=64, hbm="141GB", tp=8,
                           seq_len=32768),
     ["kv", CONFIG, "--dtype", "fp8", "--scale-block", "64", "--hbm", "141GB", "--tp", "8",
      "--seq-len", "32768"]),
    (lambda p: p.SpecdecSpec.of(metrics="examples/vllm-specdec-ngram.prom", cost=0.02,
                                candidate=["eagle3:eagle:0.75:0.04"]),
     ["specdec", "--metrics", "examples/vllm-specdec-ngram.prom", "--cost", "0.02",
      "--candidate", "eagle3:eagle:0.75:0.04"]),
    (lambda p: p.FanoutSpec.of("examples/leaf.hlog", fanout=100, hops=2, hedge_after="p95",
                               monte_carlo=1000),
     ["fanout", "--from", "examples/leaf.hlog", "--fanout", "100", "--hops", "2",
      "--hedge-after", "p95", "--monte-carlo", "1000"]),
    (lambda p: p.PrefixCacheSpec.of(TRACE, limit=300, hbm=40, dram=100, policy="weighted",
                                    curve=3),
     ["prefix-cache", TRACE, "--limit", "300", "--hbm", "40", "--dram", "100", "--policy",
      "weighted", "--curve", "3"]),
])
def test_the_document_is_the_commands(make, argv, monkeypatch):
    """Every kind: the library's document equals `--json -` of the same options, and the
    spec is frozen."""
    import tailgate.plan as plan

    monkeypatch.chdir(ROOT)
    spec = make(plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.options = None  # type: ignore[misc]
    doc = plan.run(spec)
    out = command(*argv, "--json", "-")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(json.dumps(doc))


def test_the_docs_python_example_runs_as_written(monkeypatch):
    """The page's lines, from the repository's root: the KV figures are the ones the page's
    `plan kv` output shows, and the hit rate is the command's."""
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
               if "from tailgate.plan import" in b]
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    scope: dict[str, object] = {}
    with contextlib.redirect_stdout(out):
        exec(code, scope)  # noqa: S102
    first, second = out.getvalue().splitlines()
    # docs/plan.md's `plan kv ... --tp 8 --seq-len 32768`: "sequences  32 concurrent",
    # "per token  40,992 B"
    assert first == "32 40992"
    cli = command("prefix-cache", TRACE, "--limit", "2000", "--hbm", "20000", "--curve", "0")
    assert cli.returncode == 0, cli.stderr
    replay = next(line for line in cli.stdout.splitlines() if line.startswith("replay"))
    total = re.search(r"total (\S+%)", replay).group(1)
    assert second == f"{total} of prompt tokens hit in HBM"
    assert os.path.basename(TRACE) in str(scope["cache"]["trace"]["path"])  # type: ignore[index]
