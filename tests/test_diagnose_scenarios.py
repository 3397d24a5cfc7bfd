"""`tailgate diagnose` against real faults with known causes (issue 11): each is named first,
pairs of causes are both named, and a clean run claims nothing.

The server's worker is pinned to CPU 1 and the load generator to CPU 0, so the control run
has no contention of its own making. Faults: busy loops on the server's CPU (run-queue
contention), a cgroup CPU quota (CFS throttling), SIGSTOP/SIGCONT (stopped), a mutex held
while sleeping in a small C server (futex waits), random loss on a veth into a network
namespace (TCP retransmissions).

Two causes at once are named when each accounts for its own part of the slow requests' time:
a quota, a stop or lock contention, each with packet loss (a lost segment costs a
retransmission time-out of 200 ms or more, far above the other cause's milliseconds: the
retransmitted requests are the P99, the other cause's the P90); futex waits with stops; and
busy loops with lock contention (the lock's holder and its waiters also queue behind the busy
loops on their CPU, so each slow request carries both a futex wait and a run-queue wait of
its own, each lasting a millisecond or more). Busy loops with stops cannot both be claimed:
a stopped server's requests queue up behind the stop and, when it is continued, wait again
in the run queue behind the busy loops, so one mechanism's delay lands on the very requests
the other one delayed. Whichever dominates owns both the P99 and the P90 and the other covers
no tail of its own; the attribution would have to guess, and it does not. Busy loops with
loss on the veth are not a pair here either: the server's replies cross the veth in a
softirq that, on the busy CPU, runs deferred in ksoftirqd, whose run-queue waits are not the
server's threads' ones: the P90 is slow by more than the server's own waits explain (4 % of
their latency in our runs).

Counters inspect reads (PSI, softnet, IRQs, softirqs, throttling, the server's TCP counters)
are binned on the same clock: the scenarios check that the fault shows in its own counter
(throttled time under a quota, retransmitted segments in the server's network namespace under
loss) and that the probe's context switches single out a preempted server.

Isolation from other work on the machine (a CI host is not quiet): the load generator and the
server run SCHED_FIFO (priority RT), so no ordinary task can delay them, and each scenario
injects its own cause at the priority it needs to act: the contention loops are SCHED_FIFO
above the server, spinning in bursts of a few milliseconds (a CFS-like share of the CPU, where
a FIFO loop that never slept would starve the server outright); only a CPU quota, which binds
CFS tasks alone, needs the server at an ordinary priority (nice -20 in a cgroup of many shares,
so that ordinary work delays it by little more than a wake-up). The proof runs with every
scenario: a normal-priority busy loop on each CPU for the whole module (`_noise`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from support.cgroups import cpu_cgroup, throttling_load
from support.inspect import diagnose_code
from support.netloss import Veth, random_loss
from support.nginx import Nginx, available, free_port
from support.require import require, require_diagnose_host
from support.workloads import argv_for, busy_cpus, finish, realtime, spawned, start

pytestmark = pytest.mark.timeout(180)

RT = 10         # SCHED_FIFO priority of the server and the load generator
INJECTED = 20   # and of the contention loops, which must be able to preempt the server


@pytest.fixture(autouse=True, scope="module")
def _needs_root_nginx_and_two_cpus():
    require(available())
    require_diagnose_host()


@pytest.fixture(autouse=True, scope="module")
def _noise():
    """Ordinary work on every CPU while the scenarios run: each must hold anyway."""
    with busy_cpus():
        yield


# bursts of BURST_S spinning, then a sleep: at a real-time priority, a CPU share like a CFS
# busy loop's, in slices of a few milliseconds
BURSTS = """import sys, time
burst, pause = float(sys.argv[1]), float(sys.argv[2])
end = time.monotonic() + 60
while time.monotonic() < end:
    t = time.monotonic() + burst
    while time.monotonic() < t:
        pass
    time.sleep(pause)
"""
BURST_S = 0.002


CLEAN_TRIES = 3
QUIET_STEAL_MS = 30  # a quiet VM's steal in a 4 s run: 0 to 20 ms (measured, see below)


def diagnose(target: str, pid: int, *extra: str, rate: str = "1000", duration: str = "4s",
             steal_retry: bool = True) -> dict:
    """One diagnose run of a scenario. A scenario about the service asks about the service:
    when the verdict instead claims a late generator whose CPUs the hypervisor took at
    least QUIET_STEAL_MS of (steal time: a fresh-root run saw 380 ms in 4 s, and the
    generator's lateness, reading included, was then rightly 66 % of the tail), the run
    says nothing of the service and is made again, up to CLEAN_TRIES times (``steal_retry``
    off: the scenarios about the generator itself)."""
    for attempt in range(1, CLEAN_TRIES if steal_retry else 1):
        doc = _diagnose(target, pid, *extra, rate=rate, duration=duration)
        late = [c for c in doc["causes"] if c["cause"] == "generator" and c["claimed"]]
        if not late or late[0].get("steal_ms", 0) < QUIET_STEAL_MS:
            return doc
        print(f"run {attempt}: the hypervisor made the generator late: {late[0]['sentence']}")
    return _diagnose(target, pid, *extra, rate=rate, duration=duration)


def _diagnose(target: str, pid: int, *extra: str, rate: str, duration: str) -> dict:
    out = subprocess.run(["chrt", "-f", str(RT), "taskset", "-c", "0",
                          sys.executable, "-m", "tailgate", "diagnose",
                          target, "--pid", str(pid), "--rate", rate, "--duration", duration,
                          "--workers", "1", "--json", "-", *extra],
                         capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(out.stdout)
    assert out.returncode == diagnose_code(doc), out.stderr[-2000:]
    return doc


def claimed(doc: dict) -> list[str]:
    return doc["verdict"]["claimed"]


def explain(doc: dict) -> str:
    return "\n".join(c["sentence"] for c in doc["causes"]) + f"\n{doc['tail']}"


@contextlib.contextmanager
def nginx_on_cpu1(rt: bool = True, **kw) -> Iterator[tuple[Nginx, int]]:
    with Nginx(workers=1, **kw) as ng:
        (pid,) = ng.worker_pids()
        os.sched_setaffinity(pid, {1})
        if rt:
            realtime(pid, RT)
        else:  # a CPU quota binds CFS tasks only
            os.setpriority(os.PRIO_PROCESS, pid, -20)
        yield ng, pid


def bursts_on(cpu: int, burst_s: float, pause_s: float, n: int = 1):
    """`n` loops above the server and the generator on `cpu`, each spinning `burst_s`, then
    sleeping `pause_s`. chrt and taskset exec the interpreter, so kill() reaches the loop
    itself; it ends by itself anyway."""
    return spawned([["chrt", "-f", str(INJECTED), "taskset", "-c", str(cpu), sys.executable,
                     "-c", BURSTS, str(burst_s), str(pause_s)] for _ in range(n)])


def busy_on_cpu1(n: int = 2):
    """`n` loops contending for the server's CPU, each spinning BURST_S at a time for 1/(n+1)
    of it."""
    return bursts_on(1, BURST_S, BURST_S * n, n)


@contextlib.contextmanager
def quota(pid: int, quota_us: int = 3000) -> Iterator[None]:
    with cpu_cgroup(quota_us) as cg:
        (cg / "cpu.shares").write_text("262144")  # against the ordinary work outside it
        (cg / "cgroup.procs").write_text(str(pid))
        yield


@contextlib.contextmanager
def stopping(pid: int, every_s: float = 0.5, for_s: float = 0.05) -> Iterator[None]:
    stop = threading.Event()

    def loop():
        stop.wait(0.3)
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(for_s)
            os.kill(pid, signal.SIGCONT)
            stop.wait(every_s - for_s)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def lockserver(hold_us: int, every: int, veth: Veth | None = None
               ) -> Iterator[tuple[str, int]]:
    port = free_port()
    if veth is None:
        proc = start("lockserver", port, 40, hold_us, every)
    else:  # inside the test namespace (`ip netns exec` execs it: the pid is the server's)
        proc = start_in(veth.ns, "lockserver", port, 40, hold_us, every, veth.ns_ip)
    try:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            os.sched_setaffinity(int(tid), {1})
        realtime(proc.pid, RT)
        yield f"tcp://{veth.ns_ip if veth else '127.0.0.1'}:{port}", proc.pid
    finally:
        finish(proc)


def start_in(ns: str, name: str, *args: object) -> subprocess.Popen:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv_for(name, *args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{name} did not start in {ns}: {line!r} {proc.stderr.read()!r}")
    return proc


@contextlib.contextmanager
def cpuserver(work_us: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    proc = start("cpuserver", port, 40, work_us)
    try:
        os.sched_setaffinity(proc.pid, {1})  # its connection threads inherit the main one's
        realtime(proc.pid, RT)
        yield f"tcp://127.0.0.1:{port}", proc.pid
    finally:
        finish(proc)


TCP = ("--payload", "x\\n", "--delimiter", "\\n")


# -- one cause at a time ----------------------------------------------------------------------

def series_total(doc: dict, name: str) -> float:
    return sum(v or 0 for v in doc["timeline"]["series"][name]["values"])


def disturbed(doc: dict) -> bool:
    """A run the hypervisor disturbed: only a late generator claimed, or only the generator
    and run-queue waits with more steal time on the two CPUs than a quiet VM has."""
    got = claimed(doc)
    stolen = sum(doc["evidence"]["steal_ms"].values())
    return got == ["generator"] or (bool(got) and set(got) <= {"generator", "runq"}
                                    and stolen >= QUIET_STEAL_MS)


def test_clean_run_claims_nothing():
    """nginx answers in 0.06-0.11 ms here, and about 40 % of that is the generator's thread
    being woken for the reply (a VM's wake-up): a share of the tail, never the 1 ms a claim
    needs, so it is said and not claimed (it was claimed in 3 runs of 4 at stop 50).

    A late generator is the one verdict a clean run may honestly reach: on a VM, the
    hypervisor takes the generator's vCPU for milliseconds at a time (steal time: 0 to 20 ms
    in each of six 4 s windows, measured on this project's VMs), which no priority here can
    prevent, and 4 ms of it is the P999 of a 4 s run. When the host is busy it takes more,
    from the service's CPU too: a run in `make test` saw 1,323 ms of steal in its 4 s, and
    the real-time nginx waited 24 ms at a time in the run queue, rightly named `runq` (the
    sentence gives the steal). Such a run is no control, and the tool says so: it is run
    again, up to CLEAN_TRIES times. Any other cause, a run-queue wait without steal, or a
    disturbed run every time, fails."""
    with nginx_on_cpu1() as (ng, pid):
        for attempt in range(1, CLEAN_TRIES + 1):
            doc = diagnose(ng.url("/"), pid, steal_retry=False)
            if not disturbed(doc) or attempt == CLEAN_TRIES:
                break
            print(f"run {attempt}: disturbed (steal ms {doc['evidence']['steal_ms']}): "
                  + " | ".join(c["sentence"] for c in doc["causes"] if c["claimed"]))
    assert claimed(doc) == [], explain(doc)
    series = doc["timeline"]["series"]
    assert doc["timeline"]["unknown"] == {"softirq time": "not probed (diagnose --softirq)"}
    for name in ("psi.cpu.some", "psi.memory.full", "psi.io.some", "softnet.dropped",
                 "softnet.time_squeeze", "irq.cpu1", "softirq.NET_RX.cpu1", "cgroup.nr_throttled",
                 "cgroup.throttled_ms", "tcp.retrans_segs", "switches.voluntary",
                 "switches.involuntary", "steal.cpu0", "steal.cpu1"):
        assert name in series, sorted(series)
        assert len(series[name]["values"]) == len(doc["timeline"]["t_ms"])
    assert doc["cpus"] == [1]
    # nginx blocks in epoll between requests: about a voluntary switch per request, all of
    # them in its one thread
    sw = doc["evidence"]["switches"]
    assert sw["voluntary"] >= doc["tail"]["requests"] / 2, sw
    assert list(sw["threads"]) == [str(pid)], sw
    assert not any(k.startswith("softirq_ms.") for k in series)


def test_a_late_generator_is_named_first_with_its_cpus_steal():
    """A loop above the generator on its own CPU, spinning 20 ms in every 200: the requests
    due meanwhile leave up to 20 ms late, and the few in flight when it starts are read late
    by as much. The verdict names the generator, with the steal time of its CPU (the
    hypervisor's share; on bare metal none). nginx on CPU 1 is clean."""
    with nginx_on_cpu1() as (ng, pid), bursts_on(0, 0.02, 0.18):
        doc = diagnose(ng.url("/"), pid, duration="2s", steal_retry=False)
    assert claimed(doc) == ["generator"], explain(doc)
    (gen,) = [c for c in doc["causes"] if c["cause"] == "generator"]
    assert gen["steal_ms"] == doc["evidence"]["steal_ms"]["cpu0"], (gen, doc["evidence"])
    assert "steal time" in gen["sentence"].rsplit(";", 1)[1], gen


def test_a_generator_late_sending_is_named_and_its_late_reads_are_in_no_latency():
    """Bursts of 2 ms in every 20 on the generator's CPU: a request is at most 2 ms late
    leaving, and a reply that comes during a burst waits in the socket for the burst to end.
    That wait is in no latency: a request ends at its reply's kernel receive stamp (the
    compiled engine's ``arrive_s``), and bench shows the loop's read after it apart
    (``generator.read_lag_ms``). The generator is named for its sending. Its bursts are
    short, so other work on nginx's CPU 1 weighs as much: a `make test` run saw two
    run-queue waits of 6 ms there (no steal, no preemption: something else of the suite's
    had the CPU), claimed beside the generator. Such a run is made again."""
    with nginx_on_cpu1() as (ng, pid), bursts_on(0, 0.002, 0.018):
        for attempt in range(1, CLEAN_TRIES + 1):
            doc = diagnose(ng.url("/"), pid, duration="2s", steal_retry=False)
            if claimed(doc) != ["generator", "runq"] or attempt == CLEAN_TRIES:
                break
            print(f"run {attempt}: nginx's CPU was taken by other work: "
                  + " | ".join(c["sentence"] for c in doc["causes"] if c["cause"] == "runq"))
    assert claimed(doc) == ["generator"], explain(doc)
    (gen,) = [c for c in doc["causes"] if c["cause"] == "generator"]
    assert "to send them; its lateness lasted" in gen["sentence"], gen
    parts = doc["accounting"]["sets"]["p99"]["parts"]
    assert parts["generator"]["share"] > 0.5 and "generator_read" not in parts, \
        doc["accounting"]["sentence"]
    # every reply's read lag was measured, beside the latency (the same requests)
    assert doc["bench"]["read_lag_ms"]["count"] == doc["bench"]["latency_ms"]["count"], \
        doc["bench"]


def test_softirq_time_when_asked():
    """`--softirq`: the time of every softirq per vector and CPU (a second probe). nginx's
    replies are processed in NET_RX on its own CPU (loopback delivers on the sender's CPU)."""
    with nginx_on_cpu1() as (ng, pid):
        doc = diagnose(ng.url("/"), pid, "--softirq", duration="2s")
    assert "softirq time" not in doc["timeline"]["unknown"]
    assert series_total(doc, "softirq_ms.NET_RX.cpu1") > 0, sorted(doc["timeline"]["series"])
    assert "softirq" in [c["cause"] for c in doc["causes"]]


def test_cpu_contention_is_run_queue_wait():
    with nginx_on_cpu1() as (ng, pid), busy_on_cpu1():
        doc = diagnose(ng.url("/"), pid)
    assert doc["verdict"]["first"] == "runq", explain(doc)
    (runq,) = [c for c in doc["causes"] if c["cause"] == "runq"]
    # what the hypervisor took of the service's CPU meanwhile, beside the busy loops' share
    assert runq["steal_ms"] == doc["evidence"]["steal_ms"]["cpu1"], (runq, doc["evidence"])
    last = runq["sentence"].rsplit(";", 1)[1]
    assert "the service's CPUs" in last and "steal time" in last, runq


def test_cgroup_quota_is_throttling():
    with nginx_on_cpu1(rt=False) as (ng, pid):
        rate, quota_us = throttling_load(pid, ng.url("/"))
        with quota(pid, quota_us):
            doc = diagnose(ng.url("/"), pid, "--arrival", "poisson", rate=str(rate))
    assert doc["verdict"]["first"] == "throttled", explain(doc)
    assert "runq" not in claimed(doc), explain(doc)  # throttled waits are not contention
    assert series_total(doc, "cgroup.nr_throttled") >= 3
    assert series_total(doc, "cgroup.throttled_ms") > 0


def test_a_cpu_bound_server_under_contention_is_preempted():
    """4 ms of CPU per request, sharing its CPU with two busy loops: the scheduler's slice runs
    out inside the request, so the server's thread is switched out involuntarily, and the
    run-queue waits it suffers follow those preemptions (not wake-ups)."""
    with cpuserver(work_us=4000) as (url, pid), busy_on_cpu1():
        doc = diagnose(url, pid, *TCP, rate="50", duration="3s")
    sw, ev = doc["evidence"]["switches"], doc["evidence"]
    assert sw["involuntary"] >= 1.5 * doc["tail"]["requests"], (sw, explain(doc))
    assert ev["runq_preempted"]["total_ms"] >= 0.5 * ev["runq"]["total_ms"], ev
    assert series_total(doc, "switches.involuntary") == pytest.approx(sw["involuntary"], rel=0.05)


def test_sigstop_is_stopped_not_queueing():
    with nginx_on_cpu1() as (ng, pid), stopping(pid):
        doc = diagnose(ng.url("/"), pid)
    assert doc["verdict"]["first"] == "stopped", explain(doc)
    assert "runq" not in claimed(doc), explain(doc)


def test_a_held_mutex_is_futex_wait():
    with lockserver(hold_us=3000, every=40) as (url, pid):
        doc = diagnose(url, pid, *TCP)
    assert doc["verdict"]["first"] == "futex", explain(doc)
    assert doc["causes"][0]["layer"] == "L3"


def test_packet_loss_is_retransmission():
    with Veth() as v, nginx_on_cpu1(address=v.ns_ip, netns=v.ns) as (ng, pid), \
            random_loss(v.host, 0.03):
        doc = diagnose(ng.url("/"), pid, rate="300")
    assert doc["verdict"]["first"] == "retransmit", explain(doc)
    # counted in the server's own network namespace, where it retransmits
    assert series_total(doc, "tcp.retrans_segs") >= doc["evidence"]["retransmit"]["events"] / 2


def test_an_uncontended_lock_is_not_futex_wait():
    """Every request takes the mutex, none holds it: no thread waits on it. Only the lock is
    asserted: the kernel runs without preemption, so kernel work on CPU 1 can still keep
    the real-time server waiting in the run queue for milliseconds (a fresh root's run saw
    11 such waits, 2 ms each, none after a preemption), and diagnose then rightly names it."""
    with lockserver(hold_us=0, every=0) as (url, pid):
        doc = diagnose(url, pid, *TCP)
    assert "futex" not in claimed(doc), explain(doc)
    assert doc["evidence"]["futex"]["events"] == 0, doc["evidence"]["futex"]


# -- two causes at once: both named -------------------------------------------------------------

def test_quota_and_loss_are_both_named():
    with Veth() as v, nginx_on_cpu1(rt=False, address=v.ns_ip, netns=v.ns) as (ng, pid):
        rate, quota_us = throttling_load(pid, ng.url("/"))
        with quota(pid, quota_us), random_loss(v.host, 0.01):
            doc = diagnose(ng.url("/"), pid, "--arrival", "poisson", rate=str(rate))
    assert {"throttled", "retransmit"} <= set(claimed(doc)), explain(doc)


def test_stops_and_loss_are_both_named():
    with Veth() as v, nginx_on_cpu1(address=v.ns_ip, netns=v.ns) as (ng, pid), \
            random_loss(v.host, 0.02), stopping(pid, every_s=0.5, for_s=0.05):
        doc = diagnose(ng.url("/"), pid, rate="300")
    assert {"stopped", "retransmit"} <= set(claimed(doc)), explain(doc)


# A wait on the lock counts only for the requests of the thread that waited (issue 45): the
# lock is held twice as often as in the scenarios alone (4 ms every 20th request), so that the
# requests that waited on it fill the P90 under the other cause's P99.
PAIR_HOLD = {"hold_us": 4000, "every": 20}


def test_futex_and_loss_are_both_named():
    with Veth() as v, lockserver(**PAIR_HOLD, veth=v) as (url, pid), \
            random_loss(v.host, 0.02):
        doc = diagnose(url, pid, *TCP)
    assert {"futex", "retransmit"} <= set(claimed(doc)), explain(doc)


def test_futex_and_contention_are_both_named():
    # three busy loops: with two, the run-queue share of a slow request was sometimes under
    # the 1 ms a claim needs (1 run in 7 here); with three, 8 runs of 8 named both. The lock
    # held 4 ms: at 3 ms the run-queue waits alone made part of the P99, and the futex waits
    # covered 76-100 % of it in 6 quiet runs but 49 % in one CI run (50 % is a claim); at
    # 4 ms they covered 100 % in 8 runs of 8, the run queue still 54-74 % of the time.
    with lockserver(hold_us=4000, every=40) as (url, pid), busy_on_cpu1(n=3):
        doc = diagnose(url, pid, *TCP)
    assert {"futex", "runq"} <= set(claimed(doc)), explain(doc)


def test_futex_and_stops_are_both_named():
    with lockserver(**PAIR_HOLD) as (url, pid), stopping(pid, every_s=1.0, for_s=0.02):
        doc = diagnose(url, pid, *TCP)
    assert {"futex", "stopped"} <= set(claimed(doc)), explain(doc)


# -- passive: evidence only -------------------------------------------------------------------

def test_passive_mode_lists_the_evidence(tmp_path):
    with nginx_on_cpu1() as (ng, pid), stopping(pid, every_s=0.3, for_s=0.1):
        out = subprocess.run([sys.executable, "-m", "tailgate", "diagnose", "--pid", str(pid),
                              "--duration", "2s", "--json", "-"], capture_output=True,
                             text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["mode"] == "passive" and doc["causes"][0]["cause"] == "stopped", doc["causes"]
    assert doc["evidence"]["stopped"]["events"] >= 4
