"""Every command the README and the docs/ pages show (a `$ ` line in a code block) runs here
exactly as written, from a directory holding the repository's `examples/`, and exits as the
page says; where its output is deterministic, the lines shown are what it prints. The few that
cannot run here are listed with the reason. The README's table of red lines is the catalog's."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from support.require import require

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
STATUS = re.compile(r"^  (PASS|WARN|FAIL|SKIP|UNKNOWN|ERROR)\s+(\S+)", re.M)


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_commands(text: str) -> dict[str, list[str]]:
    """Each `$ ` command of a page's code blocks (fenced, or indented by four spaces), its
    continuation lines (`\\`) joined, with the output lines shown under it."""
    commands: dict[str, list[str]] = {}
    fenced, current, pending = False, None, ""
    for raw in text.splitlines():
        if raw.startswith("```"):
            fenced, current = not fenced, None
            continue
        line = raw if fenced else raw[4:] if raw.startswith("    ") else None
        if line is None:
            current = None
            continue
        if pending:
            pending += " " + line.strip()
        elif line.startswith("$ "):
            pending = line[2:]
        elif current is not None:
            commands[current].append(line)
            continue
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        current, pending = pending, ""
        commands[current] = []
    return commands


def shown() -> dict[str, list[str]]:
    """Every page's commands; one shown on two pages must print the same on both."""
    commands: dict[str, list[str]] = {}
    for page in PAGES:
        for command, output in page_commands(page.read_text()).items():
            commands[command] = commands.get(command) or output
    return commands


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command, comments=True)
    assert argv[0] == "tailgate", command
    env = {**os.environ, "XDG_STATE_HOME": str(cwd / "state"), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "tailgate", *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def shows_what_it_prints(expected: list[str], stdout: str) -> None:
    """The shown lines, trimmed where the README says `...`, appear in the output in order."""
    printed = stdout.splitlines()
    i = 0
    for line in (x for x in expected if x != "..."):
        while i < len(printed) and printed[i].rstrip() != line.rstrip():
            i += 1
        assert i < len(printed), f"README shows {line!r}, not printed (in this order):\n{stdout}"
        i += 1


def statuses(stdout: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for status, check in STATUS.findall(stdout):
        found.setdefault(check, set()).add(status)
    assert found, stdout
    return found


def host_inspect(out: subprocess.CompletedProcess, cwd: Path) -> None:
    """inspect of the live host: exit 1 exactly when its report crosses a red line (the
    README's rule), 3 when a check raised; every layer reported, the verdict named."""
    found = statuses(out.stdout)
    every = set().union(*found.values())
    expected = 3 if "ERROR" in every else 1 if "FAIL" in every else 0
    assert out.returncode == expected, out.stdout + out.stderr
    assert re.search(r"^verdict: ", out.stdout, re.M), out.stdout
    for layer in ("L1", "L2", "L3", "L4"):
        assert re.search(rf"^{layer}  ", out.stdout, re.M), out.stdout
    # with the probe window the run-queue tail is measured, not left unknown (root, bpftrace)
    assert found["l2.sched.runqlat"] & {"PASS", "WARN", "FAIL"}, out.stdout


def host_gate(out: subprocess.CompletedProcess, cwd: Path) -> None:
    """--fail-on unknown: anything unmeasured, warned or failed fails the gate; the required
    id must be measured; the JUnit file holds one testcase per finding."""
    found = statuses(out.stdout)
    every = set().union(*found.values())
    measured = found["l2.sched.runqlat"] & {"PASS", "WARN", "FAIL"}
    expected = 3 if "ERROR" in every else 1 if every & {"WARN", "FAIL", "UNKNOWN"} or not measured else 0
    assert out.returncode == expected, out.stdout + out.stderr
    cases = ET.parse(cwd / "tailgate.xml").getroot().iter("testcase")
    names = {c.get("name").split(" [")[0] for c in cases}  # "id [subject]"
    assert names >= set(found), "a finding is missing from tailgate.xml"


Check = Callable[[subprocess.CompletedProcess, Path, list[str]], None]


def exits(code: int) -> Check:
    """Exit status `code`, and the output the README shows (deterministic commands)."""
    def check(out: subprocess.CompletedProcess, cwd: Path, expected: list[str]) -> None:
        assert out.returncode == code, out.stdout + out.stderr
        shows_what_it_prints(expected, out.stdout)
    return check


def checks_table(out: subprocess.CompletedProcess, cwd: Path, expected: list[str]) -> None:
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) >= 30, out.stdout


def serve_once(out: subprocess.CompletedProcess, cwd: Path, expected: list[str]) -> None:
    """One round: exit 0, the verdict and every red line as series, the resident run-queue
    probe up (root and bpftrace here) with a histogram of what it saw."""
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert sum(f'tailgate_verdict{{status="{s}"}} 1.0' in text
               for s in ("pass", "incomplete", "warn", "fail", "error")) == 1, text
    assert 'tailgate_probe_up{probe="runqlat",reason=""} 1.0' in text, text
    assert 'tailgate_red_line_seconds{id="l2.sched.runqlat",layer="L2"} 0.0005' in text
    count = re.search(r"^tailgate_runqueue_latency_seconds_count (\S+)$", text, re.M)
    assert count and float(count[1]) > 0, text


def rules_file(out: subprocess.CompletedProcess, cwd: Path, expected: list[str]) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    doc = yaml.safe_load((cwd / "tailgate-rules.yml").read_text())
    alerts = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert "TailgateL2SchedRunqlat" in alerts, sorted(alerts)


def live(check: Callable[[subprocess.CompletedProcess, Path], None]) -> Check:
    """A run on the live host: its output is this host's, so the rule, not the text, is checked."""
    def wrapped(out: subprocess.CompletedProcess, cwd: Path, expected: list[str]) -> None:
        check(out, cwd)
    return wrapped


RUNS = {
    "tailgate inspect --probe-window 3": live(host_inspect),
    "tailgate checks                # the table of red lines below": checks_table,
    "tailgate explain l2.sched.runqlat": exits(0),
    "tailgate compare examples/compare/before.json examples/compare/after.json --markdown - --quiet "
    "--max-regression p99=10%": exits(0),
    "tailgate compare examples/compare/after.json examples/compare/before.json --max-regression p99=10%":
        exits(1),
    "tailgate inspect --probe-window 3 --fail-on unknown --require l2.sched.runqlat --junit tailgate.xml":
        live(host_gate),
    "tailgate serve --once --interval 1 --probe-window 3": serve_once,
    "tailgate rules --out tailgate-rules.yml": rules_file,
    "tailgate plan kv examples/deepseek-v3/config.json": exits(0),
    "tailgate plan specdec --metrics examples/vllm-specdec-ngram.prom --cost 0.02": exits(0),
    # docs/plan.md
    "tailgate plan kv examples/deepseek-v3/config.json --dtype fp8 --scale-block 64 --hbm 141GB --tp 8 "
    "--seq-len 32768": exits(0),
    "tailgate plan specdec --concurrency 128 --bound memory --domain general "
    "--candidate eagle3:eagle:0.7:0.04 --candidate qwen-0.5b:draft:0.85:0.12": exits(0),
    "tailgate plan fanout --from examples/leaf.hlog --fanout 100 --monte-carlo 100000": exits(0),
    "tailgate plan fanout --from examples/leaf.hlog --fanout 100 --hops 3 --hedge-after p95 "
    "--monte-carlo 100000": exits(0),
    "tailgate plan prefix-cache tests/fixtures/llm/mooncake_conversation_trace.jsonl.gz "
    "--kv-config examples/deepseek-v3/config.json --hbm 1TB --dram 4TB --prefetch-bandwidth 50GB "
    "--curve 6 --html curve.html": exits(0),
}
# Commands the README shows that cannot run here as written, and why.
CANNOT = {
    "tailgate bench http://127.0.0.1:59979/ --rate 5000 --duration 5s --workers 1 --slo 'p999<5ms' "
    "--slo 'error_rate<0.1%'":
        "needs the HTTP server of the run shown, on that port (tests/test_bench_cli.py runs bench "
        "against a real nginx)",
    "taskset -c 0 tailgate diagnose http://127.0.0.1:PORT/ --pid WORKER --rate 1000 --duration 4s "
    "--workers 1":
        "PORT and WORKER stand for a live nginx and its stopped worker (tests/test_diagnose_scenarios.py "
        "runs that scenario)",
    # docs/plan.md
    "tailgate bench http://127.0.0.1:PORT/ --sweep 25..400 --sweep-steps 5 --duration 2s --workers 1 "
    "--connections 4 --slo 'p99<100ms'":
        "PORT stands for the serial test server of tests/test_plan_sweep.py, which runs this sweep",
    # docs/diagnose.md: a vLLM server and its spans
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf vllm serve MODEL --otlp-traces-endpoint "
    "http://127.0.0.1:4318/v1/traces":
        "starts vLLM, which is not installed here (no CPU build); tests/test_diagnose_otlp.py "
        "posts spans of vLLM's shape to the same receiver",
    "sudo tailgate diagnose openai+http://127.0.0.1:8000/v1 --pid VLLM_PID --model MODEL --rate 20 "
    "--duration 30s --otlp-listen 127.0.0.1:4318":
        "needs the vLLM server above; tests/test_diagnose_otlp.py runs diagnose --otlp-listen "
        "against the real llama-server behind a vLLM-shaped front",
    # docs/inspect.md
    "tailgate inspect --dpdk tg-724f1b06 --interval 1":
        "names a live testpmd's file prefix (tests/test_dpdk_live.py starts one and inspects it)",
}


def test_every_shown_command_is_run_or_says_why_not():
    cmds = set(shown())
    assert set(page_commands(README)) >= {"tailgate checks                # the table of red lines below"}
    unlisted = cmds - set(RUNS) - set(CANNOT)
    assert not unlisted, f"shown in README.md or docs/, neither run nor excused: {sorted(unlisted)}"
    stale = (set(RUNS) | set(CANNOT)) - cmds
    assert not stale, f"listed here but no longer shown in README.md or docs/: {sorted(stale)}"


@pytest.mark.parametrize("command", sorted(RUNS))
def test_readme_command_runs_as_written(command, tmp_path):
    if "--probe-window" in command:
        require(None if os.geteuid() == 0 else "the probe window needs root")
        require(None if shutil.which("bpftrace") else "bpftrace is not installed")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    expected = shown().get(command)
    assert expected is not None, f"not shown in README.md or docs/: {command}"
    RUNS[command](run(command, tmp_path), tmp_path, expected)


def test_every_named_example_file_ships():
    for command in shown():
        for word in shlex.split(command, comments=True):
            if word.startswith(("examples/", "tests/")):
                assert (ROOT / word).is_file(), f"{command}: {word} is not in the repository"


def test_red_line_table_is_the_catalog():
    """The README's table lists exactly what `tailgate checks` prints: id, layer, red line."""
    out = subprocess.run([sys.executable, "-m", "tailgate", "checks"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    catalog = []
    for line in out.stdout.splitlines():
        m = re.match(r"^(L\d)\s+(\S+)\s+(.*?)(?:\s+\[limit .*\])?$", line)
        assert m, line
        catalog.append((m[2], m[1], m[3]))
    section = README.split("\n## The red lines\n", 1)[1].split("\n## ", 1)[0]
    table = [tuple(c.strip().strip("`") for c in row.strip("|").split("|"))
             for row in section.splitlines() if row.startswith("| `")]
    assert table == catalog


def test_compare_examples_are_bench_results():
    """The shipped pair is what `tailgate bench --json` wrote: every request accounted for."""
    for name in ("before", "after"):
        doc = json.loads((ROOT / "examples" / "compare" / f"{name}.json").read_text())
        assert doc["requests"]["scheduled"] == doc["requests"]["sent"] == doc["requests"]["ok"] == 5000, name
        assert doc["latency_ms"]["count"] == 5000 and doc["histograms"], name
