"""`tailgate diagnose openai+http://...` against a llama-server that is killed about a third
into the run and started again on the same port (issue 43, bad input: "an engine that
restarts mid-run"). What diagnose then says, from the CLI: the requests in flight at the
kill and those sent while nothing listened end as errors, counted as such; the new
process's /metrics counters start again from zero and the timeline marks the restart (no
negative rate, no false figure); the records of the requests the new process served are
still joined; and the kernel evidence, whose threads are the dead process's (``--pid``),
is of no thread of the new one: the verdict says so with the restart and when."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.inspect import diagnose_code
from support.llm_server import MODEL_NAME, native_llama_server
from support.require import require_diagnose_host

pytestmark = pytest.mark.timeout(400)
NICE = -20  # as test_diagnose_engine's scenarios: the server and load ahead of other work
GAP_MS = 50  # short requests (16 words in, 8 tokens out), one every 50 ms over 6 s ...
LONG_AT_MS, QUIET_TO_MS = 2000, 3500  # ... but for one long generation alone in (2, 3.5) s
LONG_TOKENS = 3000  # (about 1 s of decode here: still decoding at the kill)
KILL_AFTER_S = 2.4  # a third into the run, the long one in flight
RUN_MS = 6000
BEFORE = LONG_AT_MS // GAP_MS  # short requests served by the first process: 40
AFTER = (RUN_MS - QUIET_TO_MS) // GAP_MS  # ... by the second: 50


@pytest.fixture(autouse=True, scope="module")
def _needs():
    require_diagnose_host()


def _first_request(log: Path, timeout_s: float = 120.0) -> float:
    """When the server's log first shows a request taken (the load has begun: diagnose
    attaches its probes first, which takes seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "launch_slot_" in log.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.005)
    raise AssertionError(f"no request reached the server in {timeout_s:g} s")


def _rows() -> list[dict]:
    rows = [{"timestamp": t, "input_length": 16, "output_length": 8, "hash_ids": [t]}
            for t in range(0, RUN_MS, GAP_MS) if not LONG_AT_MS <= t < QUIET_TO_MS]
    rows.append({"timestamp": LONG_AT_MS, "input_length": 16, "output_length": LONG_TOKENS,
                 "hash_ids": [LONG_AT_MS]})
    return sorted(rows, key=lambda r: r["timestamp"])


def test_an_engine_restarted_mid_run_is_unknown_after_the_restart_never_a_wrong_phase(
        tmp_path):
    """One slot. The first process serves 40 short requests and starts a long generation;
    it is killed (SIGKILL) while that one decodes, and a new one started on the same port
    before the next request (1.1 s later). The long one ends as an error, counted so; the
    50 short ones after are served by the new process, and their records joined as the 40
    before; the engine's prompt-token counter went back to zero and the timeline marks
    it, with no negative figure; the target pid's exit is named with its time, and the
    verdict says the host causes of the 51 requests in flight at the exit or after it are
    unknown, never a clean "nothing claimed"."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    with native_llama_server(tmp_path, slots=1, cpu="1", nice=NICE) as (base, first):
        port = int(base.rsplit(":", 1)[1].split("/")[0])
        diag = subprocess.Popen(
            ["nice", "-n", str(NICE), "taskset", "-c", "0", sys.executable, "-m", "tailgate",
             "diagnose", "openai+" + base, "--pid", str(first.pid), "--model", MODEL_NAME,
             "--api", "chat", "--workload", "trace", "--trace", str(trace),
             "--connections", "0", "--json", "-", "--html", str(tmp_path / "d.html")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            began = _first_request(tmp_path / "llama-native.log")
            time.sleep(max(0.0, began + KILL_AFTER_S - time.monotonic()))
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            with native_llama_server(tmp_path, slots=1, cpu="1", nice=NICE,
                                     port=port) as (_, second):
                up_s = time.monotonic() - began
                out, err = diag.communicate(timeout=300)
        finally:
            if diag.poll() is None:
                diag.kill()
                diag.wait()
    # (the run's clock starts at most a poll before the server's log shows its first
    # request: the new process must be up before the quiet gap ends)
    assert up_s < QUIET_TO_MS / 1e3 - 0.2, f"the new server was up {up_s:.2f} s into the run"
    doc = json.loads(out)
    (tmp_path / "diagnose.json").write_text(out)  # (kept for a failure's reader)
    assert diag.returncode == diagnose_code(doc), err[-3000:]
    req = doc["bench"]["requests"]
    failed = {k: v for k, v in req["errors"].items() if v}
    # the long generation in flight at the kill is the one error; no phase is made up for it
    # (SIGKILL closes its socket mid-body: the stream ends with no last chunk)
    assert req["ok"] == BEFORE + AFTER and failed == {"truncated": 1}, (req, failed)
    eng = doc["engine"]
    assert eng["records"] == {"ok": BEFORE + AFTER, "malformed": 0, "none": 0}, eng
    assert eng["not_ok"] == 1 and eng["join"]["placed"] == BEFORE + AFTER, eng
    assert all(row["generated"] == 8 for row in eng["slowest"]), eng["slowest"]
    # the restart, from the pid's exit and the counters' reset, with when
    r = doc["restart"]
    assert r["pids"] == [first.pid], r
    assert r["requests_before"] == BEFORE and r["requests_after"] == AFTER + 1, r
    (reset,) = r["counter_resets"]
    assert "engine.prompt_tokens_total" in reset["series"], reset
    # bounded by two polls 100 ms apart; the poller runs at idle priority, so a busy machine
    # stretches its gaps (255 ms once in make test, beside this nice -20 load and server)
    lo, hi = r["between_ms"]
    assert hi - lo <= 500 and reset["between_ms"][1] >= lo, r
    assert f"the target process {first.pid} exited between" in r["note"], r
    assert "their host causes are unknown" in r["note"], r
    v = doc["verdict"]
    assert v["unknown"] == r["note"], v
    assert v["claimed"] or v["unexplained"] == r["note"], v
    tl = doc["timeline"]
    assert {m["kind"] for m in tl["marks"]} == {"exit", "counter_reset"}, tl["marks"]
    # no negative figure from the counter that went back: its bins the tokens computed
    tokens = [x for x in tl["series"]["engine.prompt_tokens_total"]["values"] if x is not None]
    assert min(tokens) >= 0 and sum(tokens) > 0, tokens
    # the probes watched no thread of the new process: their bins after the exit are unseen
    bins = [i for i, t in enumerate(tl["t_ms"]) if t >= lo]
    for k, values in tl["evidence_ms"].items():
        assert all(values[i] is None for i in bins), (k, values)
        assert all(x is not None for x in values[:bins[0]]), (k, values)
    assert f"target {first.pid} exited" in (tmp_path / "d.html").read_text()
    # the dead pid's /proc files are gone from the exit on, said so; the engine's /metrics,
    # where a poll met the new process starting (refused, or 503 while it loads), was read
    # before and after: not unknown over the window
    unknown = tl["unknown"]
    assert unknown[f"/proc/{first.pid}/net/snmp"].endswith("after the target exited)"), unknown
    metrics = base.rsplit("/", 1)[0] + "/metrics"
    assert "read before and after" in unknown.get(metrics, "read before and after"), unknown
    for c in doc["causes"]:
        if not c["cause"].startswith("engine"):
            assert c["restart_unknown_requests"] == AFTER + 1, c
    print(f"new pid {second.pid}, up {up_s:.2f} s into the run; {failed}; {r['note']}")
