"""`tailgate diagnose` follows the chain of blame (issue 45), against real injected chains.

The service is chainserver.c (tests/support/workloads): its serving threads on CPU 0 beside
the load generator, the thread they wait for on CPU 1, every thread SCHED_FIFO as in
test_diagnose_scenarios; the interfering job is a loop above them on CPU 1 spinning 5 ms in
every 20 (a batch job at a higher priority), in a cpu cgroup of its own so that the verdict
can name it. Each scenario asserts, from the CLI's JSON, the causes claimed, the chain named
and the tasks in it:

* a lock holder preempted: futex <- run queue, behind the loop;
* a worker whose wake-up of the event loop is late (it sits in the run queue): poll <- run
  queue, behind the loop;
* a handler waiting for a thread blocked in a read of a FIFO whose writer (another process)
  sends a record every 10 ms: futex <- read <- the writer asleep, cut at three links;
* the same services undisturbed (no loop; a writer that keeps the FIFO full) claim nothing;
* a server with a thread parked on a futex through the whole run beside a real tail of
  another kind (the loop on its handlers' CPU) claims the run queue, never the futex;
* the one-link scenarios of test_diagnose_scenarios keep their cause: nginx behind busy loops
  is a chain of one run-queue wait behind them, nginx under a CPU quota one throttled wait,
  and the lock server whose holder sleeps with the mutex held names the holder asleep, woken
  by a timer.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cgroups import cpu_cgroup, throttling_load
from support.nginx import available, free_port
from support.require import require, require_diagnose_host
from support.workloads import busy_cpus, finish, realtime, start
from test_diagnose_scenarios import (
    CLEAN_TRIES,
    INJECTED,
    RT,
    TCP,
    _diagnose,
    busy_on_cpu1,
    disturbed,
    explain,
    lockserver,
    nginx_on_cpu1,
    quota,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True, scope="module")
def _needs_root_and_two_cpus():
    require_diagnose_host()


@pytest.fixture(autouse=True, scope="module")
def _noise():
    """Ordinary work on every CPU while the scenarios run: each must hold anyway."""
    with busy_cpus():
        yield


BURSTS = """import sys, time
end = time.monotonic() + 60
while time.monotonic() < end:
    t = time.monotonic() + 0.005
    while time.monotonic() < t:
        pass
    time.sleep(0.015)
"""


@contextlib.contextmanager
def batch_job(cpu: int = 1) -> Iterator[tuple[int, str]]:
    """The interfering job: a loop above the service on ``cpu``, spinning 5 ms in every 20, in
    a cpu cgroup of its own (real-time time granted: 40 % of each second). Yields its pid and
    its cgroup as /proc/PID/cgroup names it."""
    with cpu_cgroup() as cg:
        (cg / "cpu.rt_runtime_us").write_text("400000")
        proc = subprocess.Popen(["chrt", "-f", str(INJECTED), "taskset", "-c", str(cpu),
                                 sys.executable, "-c", BURSTS])
        try:
            (cg / "cgroup.procs").write_text(str(proc.pid))
            yield proc.pid, "/" + cg.name
        finally:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def chainserver(mode: str, *params: object, serve_cpu: int = 0) -> Iterator[tuple[str, int]]:
    port = free_port()
    proc = start("chainserver", mode, port, 50, serve_cpu, 1, *params)
    try:
        realtime(proc.pid, RT)
        yield f"tcp://127.0.0.1:{port}", proc.pid
    finally:
        finish(proc)


FEED = """import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
period, end = float(sys.argv[2]), time.monotonic() + 60
while time.monotonic() < end:
    try:
        os.write(fd, b"x\\n" * (1 if period else 4096))
    except BrokenPipeError:
        break
    if period:
        time.sleep(period)
"""


@contextlib.contextmanager
def fifo_server(period_s: float) -> Iterator[tuple[str, int, int]]:
    """chainserver's fifo mode (every 20th request needs a fresh record) and its writer, a
    process of its own on CPU 1: a record every ``period_s`` (0: as fast as the FIFO takes
    them)."""
    with tempfile.TemporaryDirectory(prefix="tailgate-45-") as tmp:
        path = Path(tmp) / "records"
        os.mkfifo(path)
        feeder = subprocess.Popen(["chrt", "-f", str(RT), "taskset", "-c", "1", sys.executable,
                                   "-c", FEED, str(path), str(period_s)])
        try:
            with chainserver("fifo", 20, path) as (url, pid):
                yield url, pid, feeder.pid
        finally:
            feeder.kill()
            feeder.wait()


def diagnose(url: str, pid: int, *extra: str) -> dict:
    return _diagnose(url, pid, *TCP, *extra, rate="1000", duration="4s")


def claimed(doc: dict) -> list[str]:
    return doc["verdict"]["claimed"]


def chain(doc: dict) -> dict | None:
    return doc["verdict"]["chain"]


def why(doc: dict) -> str:
    sigs = "\n".join(f"{s['links']} {s['claimed']}: {s['sentence']}"
                     for s in doc["chains"]["signatures"][:6])
    return explain(doc) + "\n" + sigs


def placed_all(doc: dict) -> None:
    """Every request was placed on the thread that read it (no guess)."""
    ch = doc["chains"]
    assert ch["placed"] == ch["requests"] == doc["tail"]["requests"], ch["placed"]
    assert all(r["placed"] for r in ch["slow"])


def test_a_preempted_lock_holder_is_futex_behind_the_run_queue():
    with chainserver("lock", 300, 1000) as (url, pid), batch_job() as (job, cg):
        doc = diagnose(url, pid)
    placed_all(doc)
    assert claimed(doc) == ["runq", "futex"], why(doc)
    c = chain(doc)
    assert c["links"] == ["futex", "runq"] and c["cut"] is None, why(doc)
    waiter, holder = c["example"]
    assert waiter["comm"] == "handler" and waiter["pid"] == pid
    assert holder["comm"] == "holder" and holder["pid"] == pid
    assert holder["behind"]["pid"] == job and holder["behind"]["cgroup"] == cg, holder
    assert holder["behind"]["cpu"] == 1
    assert f"runnable but not running for {holder['ms']:.1f} ms behind `python" in c["sentence"]
    assert f"(pid {job}, cgroup {cg}) on CPU 1" in c["sentence"], c["sentence"]
    assert c["remedy"].startswith("Give the thread at the end of the chain a CPU")
    # every link of every slow request is in the JSON
    slow = doc["chains"]["slow"]
    assert len(slow) == doc["tail"]["tail_p99"]
    assert sum(any([lk["kind"] for lk in ch["links"]] == ["futex", "runq"] for ch in r["chains"])
               for r in slow) >= 0.5 * len(slow)
    bands = [b for b in doc["timeline"]["bands"] if b["request"] == c["request"]]
    assert {b["kind"] for b in bands} == {"request", "futex", "runq"}, bands


def test_a_worker_late_to_wake_the_event_loop_is_poll_behind_the_run_queue():
    with chainserver("epoll", 50) as (url, pid), batch_job() as (job, cg):
        doc = diagnose(url, pid)
    placed_all(doc)
    assert claimed(doc) == ["runq"], why(doc)
    c = chain(doc)
    assert c["links"] == ["poll", "runq"] and c["cut"] is None, why(doc)
    loop, worker = c["example"]
    assert (loop["comm"], loop["syscall"]) == ("loop", "poll"), loop
    assert worker["comm"] == "worker" and worker["behind"]["pid"] == job, worker
    assert worker["behind"]["cgroup"] == cg


def test_a_handler_waiting_for_a_slow_read_is_futex_behind_the_read():
    with fifo_server(0.01) as (url, pid, feeder):
        doc = diagnose(url, pid)
    placed_all(doc)
    assert claimed(doc) == ["futex"], why(doc)
    c = chain(doc)
    # the writer is asleep between records; what woke it (a timer) is past the depth cap
    assert c["links"] == ["futex", "read", "sleep"] and c["cut"] == "depth", why(doc)
    handler, reader, writer = c["example"]
    assert handler["comm"] == "handler" and reader["comm"] == "reader"
    assert reader["syscall"] == "read" and reader["pid"] == pid
    assert writer["pid"] == feeder and writer["syscall"] == "clock_nanosleep", writer
    assert "not a process of the service" in c["sentence"]
    assert c["sentence"].endswith("(cut: the chain goes on past 3 links)")
    assert c["remedy"].startswith("A thread the request waits for sleeps")


@pytest.mark.parametrize("mode", ["lock", "epoll", "fifo"])
def test_the_same_services_undisturbed_claim_nothing(mode):
    """A run the hypervisor disturbed (only a late generator claimed: see
    test_diagnose_scenarios.test_clean_run_claims_nothing) is made again."""
    with contextlib.ExitStack() as stack:
        if mode == "fifo":
            url, pid, _ = stack.enter_context(fifo_server(0))
        else:
            url, pid = stack.enter_context(chainserver(mode, *((300, 1000) if mode == "lock"
                                                               else (50,))))
        for attempt in range(1, CLEAN_TRIES + 1):
            doc = diagnose(url, pid)
            if not disturbed(doc) or attempt == CLEAN_TRIES:
                break
            print(f"run {attempt}: disturbed: {explain(doc)}")
    placed_all(doc)
    assert claimed(doc) == [], why(doc)
    assert chain(doc) is None, why(doc)


def test_a_thread_parked_on_a_futex_is_no_cause():
    """The idle thread waits on a condition variable nobody signals (timed waits of 1 s: the
    probe prints each it saw begin and end, at least 3 s of them in a window of more than
    4 s). Under the old rule that wait covered every request and lasted all of the slow
    requests' latency: claimed as a pervasive cause (seen here: "100 % of the 41 requests
    above the P99 ... vs 91 % of all"). It served no request and woke nobody: only the run
    queue behind the loop on the handlers' CPU is claimed."""
    with chainserver("idle", 1, serve_cpu=1) as (url, pid), batch_job() as (job, _):
        doc = diagnose(url, pid)
    placed_all(doc)
    assert doc["evidence"]["futex"]["total_ms"] >= 3000, doc["evidence"]["futex"]
    assert claimed(doc) == ["runq"], why(doc)
    (futex,) = [c for c in doc["causes"] if c["cause"] == "futex"]
    assert futex["tail_p99_cover"] == 0 and futex["all_cover"] == 0, futex
    c = chain(doc)
    assert c["links"] == ["runq"] and c["example"][0]["behind"]["pid"] == job, why(doc)


def test_one_link_scenarios_keep_their_cause():
    """nginx behind busy loops on its CPU: a chain of one run-queue wait, behind them."""
    require(available())
    with nginx_on_cpu1() as (ng, pid), busy_on_cpu1() as loops:
        doc = _diagnose(ng.url("/"), pid, rate="1000", duration="4s")
    assert doc["verdict"]["first"] == "runq", why(doc)
    c = chain(doc)
    assert c["links"] == ["runq"], why(doc)
    assert c["example"][0]["behind"]["pid"] in {p.pid for p in loops}, c["example"]


def test_a_holder_sleeping_with_the_lock_is_named():
    """The lock server of test_diagnose_scenarios: its holder thread holds the mutex while it
    sleeps; the futex wait's waker is the holder, asleep, woken by a timer."""
    with lockserver(hold_us=3000, every=40) as (url, pid):
        doc = diagnose(url, pid)
    assert claimed(doc) == ["futex"], why(doc)
    c = chain(doc)
    assert c["links"] == ["futex", "sleep", "timer"] and c["cut"] is None, why(doc)
    waiter, holder, timer = c["example"]
    assert holder["comm"] == "holder" and holder["pid"] == pid, holder
    assert holder["syscall"] in ("nanosleep", "clock_nanosleep"), holder
    assert timer["kind"] == "timer" and timer["cpu"] == 1, timer  # the server's CPU
    assert c["remedy"].startswith("The chain ends in a timer")


def test_a_cpu_quota_is_a_chain_of_one_throttled_wait():
    """nginx under a CPU quota (test_diagnose_scenarios' throttling): its run-queue waits
    inside the cgroup's throttled periods are throttling, and the chain says so."""
    require(available())
    with nginx_on_cpu1(rt=False) as (ng, pid):
        rate, quota_us = throttling_load(pid, ng.url("/"))
        with quota(pid, quota_us):
            doc = _diagnose(ng.url("/"), pid, "--arrival", "poisson", rate=str(rate),
                            duration="4s")
    assert doc["verdict"]["first"] == "throttled", why(doc)
    c = chain(doc)
    assert c["links"] == ["throttled"], why(doc)
    assert c["remedy"].startswith("The chain ends in CFS throttling"), c
