"""The protocol bugs of issue 23, each against a misbehaving server the test starts
(tests/support/misbehaving.py), through the real command on both engines where both apply.

1. a server that answers after the header block and reads the body later: a large POST
   body must be on the wire whole before the next request starts on that connection;
2. a server that sends a second, unsolicited response after each real one: a request
   completed by another's response is ``protocol`` once the surplus shows;
3. connections reset or closed before their first request: no worker dies, every
   request is accounted for, and a worker that does die is counted as ``lost``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.accounting import accounted
from support.misbehaving import Misbehaving
from tailgate.bench.conn import OUT_OF_STEP
from tailgate.bench.engine_types import LOG_HEADER

pytestmark = pytest.mark.timeout(120)

TAILGATE = [sys.executable, "-m", "tailgate", "bench", "--quiet", "--workers", "1"]


@pytest.fixture(params=["fast", "python"])
def engine(request):
    return request.param


def bench(tmp: Path, url: str, engine: str, *args: str,
          timeout: float = 90) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp / f"out-{engine}.json"
    r = subprocess.run([*TAILGATE, url, "--engine", engine, "--json", str(out), *args],
                       capture_output=True, text=True, timeout=timeout)
    assert out.exists(), r.stderr + r.stdout
    data = json.loads(out.read_text())
    assert data["generator"]["engine"] == engine
    return r, data


# -- 1. a body still being written when its response arrives ---------------------------------


def test_a_large_body_is_written_whole_before_the_next_request(tmp_path, engine):
    body = tmp_path / "body.bin"
    size = 8 << 20
    body.write_bytes(b"b" * size)
    # The server reads each body slowly (a 1 ms pause per 64 KiB: ~130 ms a body), so
    # the next request is already queued when a response arrives mid-body.
    with Misbehaving("header_first", body_pause_s=0.001) as srv:
        r, data = bench(tmp_path, srv.url, engine, "-X", "POST", "--body-file", str(body),
                        "--rate", "40", "--duration", "0.25s", "--connections", "1",
                        "--max-connections", "1", "--timeout", "10s")
    req = accounted(data)
    assert r.returncode == 0, r.stderr + r.stdout
    assert req["sent"] == 10 and req["ok"] == 10, req
    # The server parsed every header block where one belonged (a request written over
    # the rest of a body would have been garbage to it), and read every body before the
    # next request; the client may end the run before the last body is all written.
    assert srv.answered == 10
    assert srv.received >= 9 and srv.body_bytes >= 9 * size


# -- 2. a connection out of step ---------------------------------------------------------------

# The stray response comes DELAY_S after each real one; requests are GAP_S apart on one
# connection, so a request is often in flight when the stray of the one before arrives
# (and completes it), and the connection goes out of step until bytes arrive with
# nothing in flight. Which requests that hits depends on timing; what must hold does
# not: no request completed by a stray stays ok (each response's length tells: the stray
# is longer), and the first request on a fresh connection (its own response) is ok. The
# last request comes alone, LAST_S later: the surplus of any chain before it has shown.
DELAY_S, GAP_S, N, LAST_S = 0.06, 0.04, 11, 0.5
REAL = {"http": len(Misbehaving("double").response()),
        "tcp": len(Misbehaving("double", "tcp").response())}


def out_of_step_run(tmp: Path, engine: str, proto: str) -> tuple[dict, dict]:
    """The schedule above through the library (a schedule of its own), with --log."""
    from tailgate.bench.result import RunInfo, build_result, read_log
    from tailgate.bench.target import parse_target
    from tailgate.bench.workers import plan, run_here

    times = np.append(np.arange(N - 1) * GAP_S, (N - 2) * GAP_S + LAST_S)
    log = tmp / f"log-{engine}-{proto}.csv"
    with Misbehaving("double", proto, delay_s=DELAY_S) as srv:
        opts = {"payload": b"ping\n", "delimiter": b"\n"} if proto == "tcp" else {}
        target = parse_target(srv.url, **opts)
        info = RunInfo(target=srv.url, protocol=target.kind, rate=N / float(times[-1]),
                       duration_s=float(times[-1]), workers=1, connections=1,
                       max_connections=1, timeout_s=2.0, engine=engine)
        (cfg,) = plan(info, target, [str(log)], schedule=times)
        data = build_result(info, [run_here(cfg)]).json
    assert data["generator"]["engine"] == engine
    return data, read_log(LOG_HEADER + log.read_text())


@pytest.mark.parametrize("proto", ["http", "tcp"])
def test_a_response_after_a_stray_one_is_a_protocol_error(tmp_path, engine, proto):
    data, log = out_of_step_run(tmp_path, engine, proto)
    req = accounted(data)
    outcomes, nbytes = log["outcome"][np.argsort(log["id"])], log["bytes"][np.argsort(log["id"])]
    assert len(outcomes) == N
    for o, b in zip(outcomes.tolist(), nbytes.tolist(), strict=True):
        if b != REAL[proto]:  # completed by (or with) a stray response
            assert o == "protocol", (outcomes, nbytes)
    assert outcomes[0] == outcomes[-1] == "ok"  # first responses on fresh connections
    assert "protocol" in set(outcomes.tolist()), (outcomes, nbytes)
    assert req["ok"] == int(np.count_nonzero(outcomes == "ok"))  # log and counts agree
    assert req["errors"]["protocol"] == N - req["ok"]
    (example,) = req["error_examples"]["protocol"]
    assert example == {"reason": OUT_OF_STEP, "count": N - req["ok"]}
    assert data["connections"]["errors"]["protocol"] >= 1  # the strays: the connections'


def test_an_out_of_step_connection_fails_an_error_slo(tmp_path, engine):
    """Without --log the counts say the same, and an SLO on errors sees them."""
    with Misbehaving("double", delay_s=DELAY_S) as srv:
        r, data = bench(tmp_path, srv.url, engine, "--rate", str(1 / GAP_S), "--requests",
                        str(N), "--connections", "1", "--max-connections", "1",
                        "--timeout", "2s", "--slo", "errors<1")
    req = accounted(data)
    assert req["errors"]["protocol"] >= 1 and req["ok"] + req["errors"]["protocol"] == N
    assert data["slo"][0]["pass"] is False and r.returncode == 1


# -- 3. connections that die before their first request --------------------------------------


def test_connections_reset_at_accept_lose_no_request(tmp_path, engine):
    """Every other connection reset at accept, the others closed after one answer: many
    new connections while requests wait, some reset before their first request is
    written (before the fix a Python worker then died writing to the closed transport
    and hung until the grace period: 'workers [0] sent no result', half the schedule)."""
    with Misbehaving("reset_alternate") as srv:
        r, data = bench(tmp_path, srv.url, engine, "--rate", "1000", "--duration", "2s",
                        "--workers", "2", "--timeout", "2s")
    req = accounted(data)
    assert req["scheduled"] == req["sent"] == 2000
    assert "lost" not in req and not [w for w in data["warnings"] if "sent no result" in w]
    # A request written before the RST arrived is `reset` (fresh connection, no response
    # byte), and so is one whose connection was reset as its connect completed (never
    # `connect`: the handshake was done, issue 48); one still queued at its deadline is
    # `timeout`; one whose connection died before the write waits for another.
    kinds = {k for k, v in req["errors"].items() if v}
    assert kinds <= {"reset", "timeout"}, req
    assert 0 < req["ok"] <= srv.answered and srv.reset == (srv.accepted + 1) // 2 > 0
    assert r.returncode == 0, r.stderr


def test_idle_connections_closed_by_the_server_with_retry_stale(tmp_path, engine):
    with Misbehaving("idle_close", delay_s=0.02) as srv:
        r, data = bench(tmp_path, srv.url, engine, "--rate", "50", "--duration", "1s",
                        "--arrival", "poisson", "--connections", "4", "--timeout", "2s",
                        "--retry-stale")
    req = accounted(data)
    assert req["scheduled"] == req["sent"] == 43  # 50/s for 1 s, Poisson, seed 0
    assert req["ok"] == srv.answered == 43, req
    assert srv.closed_idle >= 1
    assert r.returncode == 0, r.stderr


def test_a_worker_that_dies_is_lost_and_fails_the_run(tmp_path):
    """A worker killed mid-run: its share stays in the schedule as `lost`, exit 1."""
    with Misbehaving("idle_close", delay_s=30.0) as srv:  # (a well-behaved server)
        out = tmp_path / "out.json"
        proc = subprocess.Popen([*TAILGATE, srv.url, "--engine", "python", "--rate", "20",
                                 "--duration", "3s", "--workers", "2", "--timeout", "1s",
                                 "--json", str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        kill_one_worker(proc.pid)
        stdout, stderr = proc.communicate(timeout=90)
    data = json.loads(out.read_text())
    req = data["requests"]
    assert req["scheduled"] == 60 and req["lost"] == 30, req
    assert req["scheduled"] == req["sent"] + req["abandoned"] + req["lost"]
    assert data["accounting"]["consistent"], data["accounting"]
    assert any("counted as lost" in w for w in data["warnings"]), data["warnings"]
    assert proc.returncode == 1, stdout + stderr


def kill_one_worker(parent: int) -> None:
    """SIGKILL one of ``parent``'s worker processes once the run has started."""
    import os
    import signal
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = Path(f"/proc/{parent}/task/{parent}/children")
        pids = [int(p) for p in kids.read_text().split()] if kids.exists() else []
        if len(pids) >= 2:
            time.sleep(1.0)  # inside the measured run
            os.kill(pids[0], signal.SIGKILL)
            return
        time.sleep(0.05)
    raise AssertionError("the workers did not start")


# -- the engines agree request by request ------------------------------------------------------


def test_both_engines_give_every_request_the_same_outcome_status_and_bytes(tmp_path):
    """One schedule against a server whose answer depends only on the request's id (the
    client's test mode stamps each request): both engines record the same outcome,
    status and byte count for every request, whichever connection carried it."""
    from dataclasses import replace

    from support.misbehaving import by_seq_response
    from tailgate.bench.result import RunInfo, build_result, read_log
    from tailgate.bench.target import parse_target
    from tailgate.bench.workers import plan, run_here

    n = 60
    rows = {}
    for engine in ("fast", "python"):
        log = tmp_path / f"{engine}.csv"
        with Misbehaving("by_seq") as srv:
            target = parse_target(srv.url)
            info = RunInfo(target=srv.url, protocol="http", rate=100.0, duration_s=n / 100,
                           workers=1, connections=2, max_connections=8, timeout_s=2.0,
                           engine=engine)
            cfg = replace(plan(info, target, [str(log)])[0], check_seq=True)
            data = build_result(info, [run_here(cfg)]).json
        accounted(data)
        col = read_log(LOG_HEADER + log.read_text())
        order = np.argsort(col["id"])
        rows[engine] = list(zip(col["id"][order].tolist(), col["outcome"][order].tolist(),
                                col["status"][order].tolist(), col["bytes"][order].tolist(),
                                strict=True))
    assert rows["fast"] == rows["python"]
    want = {0: "ok", 1: "status_4xx", 2: "status_5xx", 3: "ok", 4: "ok"}
    assert [(i, o) for i, o, _, _ in rows["fast"]] == [(i, want[i % 5]) for i in range(n)]
    # the byte count is the stamped answer's whole length
    assert [b for *_, b in rows["fast"]] == [len(by_seq_response(i)) for i in range(n)]
