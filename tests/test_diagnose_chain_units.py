"""The chain of blame (diagnose.chain), on probe lines written as diagnose.bt prints them:
who served each request, the walk back through the wakers, ownership of evidence, the
judgement of chains and the timeline's bands."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.diagnose.attribution import Owned, attribute
from tailgate.diagnose.causes import CAUSES
from tailgate.diagnose.chain import Blame, bands, judge
from tailgate.diagnose.evidence import parse_events
from tailgate.probes.driver import program_path
from tailgate.spans import touched

pytestmark = pytest.mark.unit

MS = 1_000_000
T0 = 10_000 * MS
PORT = 8080
SVC = 100  # the service's pid; 101.. its threads
GEN = 50  # the generator's thread
CRIT = {"min_cover": 0.5, "min_lift": 1.5, "min_share": 0.1, "min_ms": 1.0}


def request(i: int, conn: int, tid: int, lat_ms: float) -> tuple[list[str], int, int]:
    """The reads of one request: the service's thread ``tid`` reads it 0.1 ms after it is
    sent on connection ``conn``; the generator reads the reply just before its end."""
    a = T0 + i * 20 * MS
    b = a + int(lat_ms * MS)
    return [f"C {tid} {a + MS // 10} {PORT} {conn}", f"C {GEN} {b - 20_000} {conn} {PORT}"], a, b


def names(*tids: int, since: int = T0 - 1000 * MS) -> list[str]:
    return [f"N {t} {SVC} 1 {since} srv" for t in tids]


def run(lines: list[str], starts: list[int], ends: list[int], service=(101, 102, 103, 104)):
    ev = parse_events(["\n".join(lines)])
    assert ev.malformed == 0
    s, e = np.array(starts, np.int64), np.array(ends, np.int64)
    return ev, s, e, Blame.of(ev, set(service), PORT, s, e)


def lock_preempted(slow_every: int = 10, n: int = 200):
    """Handler 101 serves every request; every ``slow_every``-th waits 10 ms on a futex for
    holder 102, itself runnable behind `busy` (pid 900) on CPU 1 for 9.5 ms of it. Thread 103
    is parked on a futex for the whole run."""
    lines = names(101, 102, 103)
    starts, ends = [], []
    for i in range(n):
        slow = i % slow_every == 0
        rl, a, b = request(i, 40000 + i % 4, 101, 11 if slow else 0.5)
        lines += rl
        if slow:
            lines += [f"O 101 {a + MS // 5} {a + 10 * MS} 202",
                      f"F 101 {a + MS // 5} {a + 10 * MS}",
                      f"W 101 {a + 10 * MS - 10_000} 102 {SVC} 1 0 srv",
                      f"R 102 {a + MS // 10} {a + 9 * MS + MS // 2} 1 901 900 1 busy"]
        starts.append(a)
        ends.append(b)
    lines.append(f"F 103 {T0 - MS} {T0 + n * 20 * MS + MS}")
    return lines, starts, ends


def test_serving_thread_comes_from_the_reads_of_its_connection():
    lines = names(101, 102)
    starts, ends = [], []
    for i, tid in enumerate((101, 102, 101)):
        rl, a, b = request(i, 40000 + i, tid, 2)
        lines += rl
        starts.append(a)
        ends.append(b)
    # a read by 102 on another connection at the same time is not request 0's
    lines.append(f"C 102 {T0 + MS // 5} {PORT} 49999")
    _, _, _, bl = run(lines, starts, ends)
    assert bl.serve.threads == [(101,), (102,), (101,)]
    assert bl.serve.placed == 3 and bl.serve.pool == (101, 102)


def test_a_reply_read_after_its_arrival_still_finds_its_connection():
    """A request ends at its reply's kernel receive stamp; the generator reads the reply up
    to a send later (the compiled loop defers reads to its next send). Its connection is
    found from that read, not from the reads before the stamp (another request's)."""
    lines = names(101, 102)
    starts, arrived, reads = [], [], []
    for i, tid in enumerate((101, 102, 101)):
        rl, a, b = request(i, 40000 + i, tid, 2)
        lines += rl
        starts.append(a)
        arrived.append(b - MS)  # in the kernel 1 ms before the generator read it
        reads.append(b)
    ev = parse_events(["\n".join(lines)])
    s, e = np.array(starts, np.int64), np.array(arrived, np.int64)
    bl = Blame.of(ev, {101, 102}, PORT, s, e, reads=np.array(reads, np.int64))
    assert bl.serve.threads == [(101,), (102,), (101,)] and bl.serve.placed == 3
    # without the reads, the last read before each stamp is none of the request's own
    assert Blame.of(ev, {101, 102}, PORT, s, e).serve.placed == 0


def test_futex_wait_behind_a_preempted_lock_holder():
    ev, s, e, bl = run(*lock_preempted())
    (c,) = bl.per_request[0]
    assert c.signature == ("futex", "runq") and c.cut is None
    first, holder = c.links
    assert (first.tid, holder.tid) == (101, 102)
    assert holder.behind.comm == "busy" and holder.behind.tgid == 900 and holder.behind.cpu == 1
    # the holder's wait counted from the waiter's start to the wake-up
    assert holder.a == first.a and holder.b == s[0] + 9 * MS + MS // 2
    assert bl.per_request[1] == []
    out = judge(bl, s, e, CRIT, {900: "/batch"}, {SVC})
    v = out["verdict"]
    assert v["links"] == ["futex", "runq"]
    assert v["example"][1]["behind"] == {"tid": 901, "pid": 900, "comm": "busy", "cpu": 1,
                                         "cgroup": "/batch"}
    assert "its waker `srv` (tid 102) runnable but not running for 9.3 ms behind " \
           "`busy` (pid 900, cgroup /batch) on CPU 1" in v["sentence"], v["sentence"]
    assert v["remedy"].startswith("Give the thread at the end of the chain a CPU")
    # every slow request's links in the JSON
    assert len(out["slow"]) == 20 and all(r["chains"] for r in out["slow"])


def test_a_thread_parked_for_the_whole_run_is_nobodys_cause():
    """The old rule: thread 103's futex wait covers every request, lasts all of the slow
    requests' latency and is claimed as pervasive. Owned, it counts for no request (103 read
    nothing and woke nobody); the handler's own waits still do."""
    ev, s, e, bl = run(*lock_preempted())
    futex = np.array([(a, b) for _, a, b in ev.intervals["futex"]], np.int64)
    assert touched(s, e, futex).all()
    own = bl.owned(s, e, ev.intervals["futex"])
    assert own.threads == 1 and own.hit.sum() == 20
    atts, _ = attribute(s, e, {CAUSES["futex"]: own}, sends=None)
    (a,) = atts
    assert a.claimed and a.all_cover == pytest.approx(0.1)
    only_idle = [(t, a, b) for t, a, b in ev.intervals["futex"] if t == 103]
    old, _ = attribute(s, e, {CAUSES["futex"]: futex[-1:]})
    assert old[0].claimed  # the bug this fixes
    atts, _ = attribute(s, e, {CAUSES["futex"]: bl.owned(s, e, only_idle)})
    assert not atts[0].claimed and atts[0].tail_cover == 0


def test_the_holder_in_a_chain_owns_its_run_queue_wait_for_that_request():
    ev, s, e, bl = run(*lock_preempted())
    assert bl.scope[0].serving == (101,) and bl.scope[1].serving == (101,)
    a = int(s[0])
    assert bl.scope[0].clips == ((102, a + MS // 5, a + 10 * MS - 10_000),)
    assert bl.scope[1].clips == ()
    own = bl.owned(s, e, ev.runq_not_after_stop())
    assert own.hit.sum() == 20 and own.hit[0] and not own.hit[1]


def test_a_lock_convoy_is_one_link_to_its_holder():
    """101 is woken by 104, another waiter, woken by the holder 102 that was preempted."""
    lines = names(101, 102, 104)
    rl, a, b = request(0, 40000, 101, 12)
    lines += rl + [f"O 101 {a + MS // 5} {a + 11 * MS} 202",
                   f"W 101 {a + 11 * MS - 5000} 104 {SVC} 1 0 srv",
                   f"O 104 {a + MS // 10} {a + 10 * MS} 202",
                   f"W 104 {a + 10 * MS - 5000} 102 {SVC} 1 0 srv",
                   f"R 102 {a} {a + 9 * MS} 1 901 900 1 busy"]
    _, _, _, bl = run(lines, [a], [b])
    (c,) = bl.per_request[0]
    assert c.signature == ("futex", "runq")
    assert c.links[0].convoy == 1 and c.links[1].tid == 102


def test_chains_leaving_the_watched_tasks_say_so():
    """A read woken by an outside writer (depth 3, asleep: woken by a timer past the cap); a
    wait woken by a timer; a waker first seen after the wait began."""
    lines = names(101, 102) + [f"N 700 700 3 {T0 - MS} feeder"]
    starts, ends = [], []
    rl, a, b = request(0, 40000, 101, 10)
    lines += rl + [f"O 101 {a + MS // 5} {a + 9 * MS} 202",
                   f"W 101 {a + 9 * MS} 102 {SVC} 1 0 srv",
                   f"O 102 {a} {a + 9 * MS - 10_000} 0",
                   f"W 102 {a + 9 * MS - 20_000} 700 700 0 0 feeder",
                   f"o 700 {a - MS} {a + 9 * MS - 30_000} 230",
                   f"W 700 {a + 9 * MS - 40_000} 0 0 0 1 swapper/0"]
    starts.append(a)
    ends.append(b)
    rl, a, b = request(1, 40001, 101, 5)
    lines += rl + [f"O 101 {a + MS // 5} {a + 4 * MS} 230",
                   f"W 101 {a + 4 * MS} 0 0 1 1 swapper/1"]
    starts.append(a)
    ends.append(b)
    rl, a, b = request(2, 40002, 101, 5)
    lines += rl + [f"O 101 {a + MS // 5} {a + 4 * MS} 202",
                   f"W 101 {a + 4 * MS} 555 555 1 0 stranger"]
    starts.append(a)
    ends.append(b)
    _, s, e, bl = run(lines, starts, ends)
    (c,) = bl.per_request[0]
    assert c.signature == ("futex", "read", "sleep") and c.cut == "depth"
    assert c.links[2].tgid == 700
    (c,) = bl.per_request[1]
    assert c.signature == ("sleep", "timer") and c.links[1].cpu == 1 and c.cut is None
    (c,) = bl.per_request[2]
    assert c.signature == ("futex", "unknown") and c.cut == "untracked"
    from tailgate.diagnose.chain import describe

    text = describe(bl.per_request[0][0], {700: "/feeders"}, {SVC})
    assert "`feeder` (pid 700, tid 700, cgroup /feeders; not a process of the service) asleep " \
           "(clock_nanosleep)" in text and text.endswith("(cut: the chain goes on past 3 links)")


def test_waits_for_work_are_no_link():
    """The thread waited in epoll for the request to arrive, and again after its reply: the
    request waited for neither."""
    lines = names(101)
    rl, a, b = request(0, 40000, 101, 3)
    lines += rl + [f"O 101 {a - 50 * MS} {a + MS // 10} 232",
                   f"O 101 {b - MS // 2} {b + 50 * MS} 232"]
    _, _, _, bl = run(lines, [a], [b])
    assert bl.per_request == [[]]


def test_without_reads_every_thread_may_have_served():
    lines = names(101, 102) + [f"F 102 {T0} {T0 + 5 * MS}"]
    ev, s, e, bl = run(lines, [T0], [T0 + 6 * MS])
    assert bl.serve.placed == 0 and bl.serve.pool == (101, 102, 103, 104)
    assert "every thread" in bl.note
    assert bl.owned(s, e, ev.intervals["futex"]).hit.tolist() == [True]


def test_bands_are_the_generic_shape():
    _, s, e, bl = run(*lock_preempted())
    out = bands(bl, s, e, T0, limit=2)
    assert {tuple(sorted(b)) for b in out} == {("end_ms", "kind", "label", "request", "row",
                                                "source", "start_ms")}
    req = [b for b in out if b["kind"] == "request"]
    assert [b["request"] for b in req] == [0, 10]
    holder = [b for b in out if b["row"] == "srv (102)" and b["request"] == 0]
    assert holder[0]["kind"] == "runq" and holder[0]["start_ms"] == pytest.approx(0.2)
    assert "behind busy (900)" in holder[0]["label"]
    assert all(b["source"] == "chain" for b in out)


def test_owned_counts_no_thread_it_did_not_use():
    s, e = np.array([0, 100], np.int64), np.array([50, 150], np.int64)
    from tailgate.diagnose.chain import Scope, owned

    by = {1: np.array([[10, 20]]), 3: np.array([[0, 200]])}
    own = owned(s, e, [Scope((1,)), Scope((2,))], by)
    assert isinstance(own, Owned)
    assert own.hit.tolist() == [True, False] and own.inside.tolist() == [10, 0]
    assert own.threads == 1 and own.spans.tolist() == [[10, 20]]
    # a chain thread's evidence only inside the window the request waited for it in
    own = owned(s, e, [Scope((1,)), Scope((2,), ((3, 120, 130),))], by)
    assert own.inside.tolist() == [10, 10] and own.threads == 2


def test_the_probe_compiles():
    """bpftrace's dry run (-d: parse, check and compile, attach nothing) of the program with
    its wake-up and connection probes."""
    if shutil.which("bpftrace") is None:
        pytest.fail("bpftrace is not installed (Debian package bpftrace)")
    out = subprocess.run(["bpftrace", "-d", str(program_path("diagnose")), "1000", "0",
                          *["1"] * 8, str(PORT)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "WARNING" not in out.stderr, out.stderr


def test_the_html_draws_the_band_layer():
    """timeline.bands, drawn generically: a bar per band on its row, one trace per source and
    kind (an engine's phases draw beside the chains with no change), the chain's links joined
    through their ends, the rows top-down in their order of appearance."""
    from tailgate.report.diagnose_html import timeline_figure

    tl = {"t_ms": [0.0, 100.0], "bin_ms": 100.0, "evidence_ms": {}, "instants": {},
          "series": {}, "latency_p99_ms": [1.0, 2.0], "latency_max_ms": [1.0, 9.0],
          "bands": [
              {"row": "requests", "start_ms": 10.0, "end_ms": 21.0, "kind": "request",
               "label": "request 7: 11.00 ms", "source": "chain", "request": 7},
              {"row": "handler (101)", "start_ms": 10.2, "end_ms": 20.0, "kind": "futex",
               "label": "futex wait 9.80 ms", "source": "chain", "request": 7},
              {"row": "holder (102)", "start_ms": 10.2, "end_ms": 19.5, "kind": "runq",
               "label": "runnable 9.30 ms behind busy (900)", "source": "chain", "request": 7},
              {"row": "slot 0", "start_ms": 5.0, "end_ms": 9.0, "kind": "prefill",
               "label": "prefill 512 tokens", "source": "engine", "request": None}]}
    fig = timeline_figure(tl)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert sorted(bars) == ["chain: futex", "chain: request", "chain: runq", "engine: prefill"]
    runq = bars["chain: runq"]
    assert list(runq.y) == ["holder (102)"] and list(runq.base) == [10.2]
    assert list(runq.x) == [pytest.approx(9.3)] and "behind busy (900)" in runq.hovertext[0]
    assert bars["engine: prefill"].hovertext[0] == "prefill 512 tokens"
    (line,) = [t for t in fig.data if t.name == "chain (who woke whom)"]
    assert list(line.x) == [19.5, 20.0, None] and list(line.y) == ["holder (102)",
                                                                    "handler (101)", None]
    rows = fig.layout.yaxis3.categoryarray  # row 2's axis (row 1 has a secondary axis)
    assert list(rows) == ["slot 0", "holder (102)", "handler (101)", "requests"]


def test_a_run_queue_wait_inside_a_throttled_period_is_throttling():
    lines = names(101)
    rl, a, b = request(0, 40000, 101, 6)
    lines += rl + [f"R 101 {a + MS // 5} {a + 5 * MS} 1 0 0 1 swapper/1"]
    ev = parse_events(["\n".join(lines)])
    s, e = np.array([a], np.int64), np.array([b], np.int64)
    bl = Blame.of(ev, {101}, PORT, s, e, throttled=np.array([[a, a + 5 * MS]]))
    (c,) = bl.per_request[0]
    assert c.signature == ("throttled",)
    from tailgate.diagnose.chain import describe, remedy

    assert describe(c, {}, {SVC}).startswith("runnable but throttled (its cgroup's CPU quota "
                                             "spent) 4.8 ms")
    assert "cpu.cfs_quota_us" in remedy(c)
    bl = Blame.of(ev, {101}, PORT, s, e)  # no throttling: a wait on an idle CPU
    (c,) = bl.per_request[0]
    assert c.signature == ("runq",)
    assert "(it was idle: the wake-up's own latency)" in describe(c, {}, {SVC})


def test_a_wakers_open_wait_is_no_thread_of_the_service():
    """The probe's map of waits still open at its end holds the wakers it tracked too (the
    slow device's process of test_diagnose_profile): those are not the service's threads,
    whose time the accounting splits."""
    from tailgate.diagnose.analyse import _threads
    from tailgate.diagnose.evidence import ProbeMaps

    ev = parse_events(["\n".join(names(101) + [f"N 700 700 2 {T0} feeder"])])
    maps = ProbeMaps(switches={101: {"voluntary": 3, "involuntary": 0}},
                     open_waits={101: (T0 + MS, 0), 700: (T0 + MS, 230)})
    s, e = np.array([T0], np.int64), np.array([T0 + 5 * MS], np.int64)
    threads = _threads(ev, maps, s, e, T0 + 10 * MS)
    assert sorted(threads) == [101] and threads[101]["read"].tolist() == [[T0 + MS, T0 + 10 * MS]]


def engine_server(n: int = 200, slow_every: int = 10, stated: bool = True,
                  herd: tuple[int, ...] = ()):
    """An LLM server: HTTP thread 101 reads every request and waits on a condition variable
    (a futex) for the engine's thread 110, which reads nothing; every ``slow_every``-th
    request waits 6 ms before the engine's prefill, prefilled for 2.5, decoded for 1, its
    HTTP thread waiting from 0.2 ms to 9 ms (woken by 110 for its first token). With
    ``stated`` the engine states that wait as its queue (vLLM's spans); else the engine had
    no other request meanwhile: held. Request 5's wait is ended by 102, another HTTP
    thread (reading the port too): a lock, no engine's. The slow requests in ``herd`` wait
    twice: until 3 ms, ended by 102 (another request's result woke every HTTP thread), then
    from 3.1 ms to 9 ms, ended by 110."""
    from tailgate.diagnose.engine import Windows

    lines = names(101, 102, 110) + [f"C 102 {T0 - 500 * MS} {PORT} 39999"]
    starts, ends = [], []
    win = [np.zeros(n, np.int64) for _ in range(4)]
    for i in range(n):
        slow = i % slow_every == 0
        rl, a, b = request(i, 40000 + i % 4, 101, 10 if slow or i == 5 else 0.5)
        lines += rl
        for k, v in enumerate((a, a + 6 * MS if slow else a, a + 8 * MS + MS // 2 if slow
                               else a + MS // 4, b - MS // 2)):
            win[k][i] = v
        if i in herd:
            lines += [f"O 101 {a + MS // 5} {a + 3 * MS} 202", f"F 101 {a + MS // 5} {a + 3 * MS}",
                      f"W 101 {a + 3 * MS - 10_000} 102 {SVC} 1 0 srv",
                      f"O 101 {a + 31 * MS // 10} {a + 9 * MS} 202",
                      f"F 101 {a + 31 * MS // 10} {a + 9 * MS}",
                      f"W 101 {a + 9 * MS - 10_000} 110 {SVC} 1 0 srv"]
        elif slow or i == 5:
            waker = 110 if slow else 102
            lines += [f"O 101 {a + MS // 5} {a + 9 * MS} 202", f"F 101 {a + MS // 5} {a + 9 * MS}",
                      f"W 101 {a + 9 * MS - 10_000} {waker} {SVC} 1 0 srv"]
        starts.append(a)
        ends.append(b)
    return lines, starts, ends, Windows(*win, np.where(win[0] != win[1], win[0], 0)
                                        if stated else None)


def test_a_wait_for_the_engine_is_the_engines_phase_not_a_lock():
    from tailgate.diagnose.chain import describe, owned_causes, remedy, through_engine

    lines, starts, ends, win = engine_server()
    ev, s, e, bl = run(lines, starts, ends, service=(101, 102, 110))
    assert bl.per_request[0][0].signature == ("futex", "on_cpu")  # before: a futex wait
    before = owned_causes(bl, ev, s, e, np.zeros((0, 2), np.int64))["futex"]
    atts, _ = attribute(s, e, {CAUSES["futex"]: before})
    assert atts[0].claimed  # what diagnose said of llama-server: futex, first
    resolved = through_engine(bl, win)
    a = int(s[0])
    assert (101, a + MS // 5, a + 9 * MS) in resolved and len(resolved) == 20
    (c,) = bl.per_request[0]
    assert c.signature == ("futex", "engine_queue")
    engine = c.links[1]
    # the phase that overlapped the wait most, on the engine's thread, over the overlap
    assert (engine.tid, engine.a, engine.b) == (110, a + MS // 5, a + 6 * MS)
    assert "its waker `srv` (tid 110) holding it in the engine's queue (no free slot) for " \
           "5.8 ms" in describe(c, {}, {SVC}), describe(c, {}, {SVC})
    assert remedy(c).startswith("Add slots or replicas")
    # the other HTTP thread's wake-up is a lock's: still a futex chain, still futex evidence
    assert bl.per_request[5][0].signature == ("futex", "on_cpu")
    after = owned_causes(bl, ev, s, e, np.zeros((0, 2), np.int64), resolved)["futex"]
    assert after.hit.tolist() == [i == 5 for i in range(len(s))]
    atts, _ = attribute(s, e, {CAUSES["futex"]: after})
    assert not atts[0].claimed
    # the chain is judged as its own cause, at L4
    out = judge(bl, s, e, CRIT, {}, {SVC})
    assert out["verdict"]["links"] == ["futex", "engine_queue"]
    (sig,) = [x for x in out["signatures"] if x["links"] == ["futex", "engine_queue"]]
    assert sig["layer"] == "L4" and sig["claimed"]


def test_a_wake_up_by_another_serving_thread_while_queued_is_the_engines_not_a_lock():
    """llama-server's HTTP threads share one condition for every result, so each result
    wakes them all: request 20's thread, its request queued, is woken at 3 ms by 102 and
    waits again until the engine's 110 wakes it for its first token. Both waits are the
    engine's queue, neither futex evidence; request 5's, ended by 102 while its tokens were
    decoded, stays a lock's; and with no wait the engine's thread ended, the peer's wake-up
    has no engine to name and stays futex."""
    from tailgate.diagnose.chain import describe, link_json, owned_causes, through_engine

    lines, starts, ends, win = engine_server(herd=(20,))
    ev, s, e, bl = run(lines, starts, ends, service=(101, 102, 110))
    a = int(s[20])
    resolved = through_engine(bl, win)
    assert (101, a + MS // 5, a + 3 * MS) in resolved and len(resolved) == 21
    early, late = bl.per_request[20][:2]
    assert early.signature == late.signature == ("futex", "engine_queue")
    assert (early.links[1].tid, early.links[1].via) == (110, 102)
    assert link_json(early.links[1], {})["woken_by"] == 102
    # the engine's own host evidence counts for the request inside that wait, as where it woke
    assert (110, a + MS // 5, a + 3 * MS) in bl.scope[20].clips
    assert late.links[1].via == 0 and "woken_by" not in link_json(late.links[1], {})
    assert ("its engine `srv` (tid 110) holding it in the engine's queue (no free slot) for "
            "2.8 ms (the wait was ended by tid 102, another serving thread") in describe(
                early, {}, {SVC}), describe(early, {}, {SVC})
    assert bl.per_request[5][0].signature == ("futex", "on_cpu")
    futex = owned_causes(bl, ev, s, e, np.zeros((0, 2), np.int64), resolved)["futex"]
    assert futex.hit.tolist() == [i == 5 for i in range(len(s))]
    # the engine's thread ended no wait: whose phase it was is not known
    alone = [ln for ln in lines if not (ln.startswith("W ") and ln.split()[3] == "110")]
    _, _, _, bl = run(alone, starts, ends, service=(101, 102, 110))
    assert through_engine(bl, win) == []
    assert bl.per_request[20][0].signature[0] == "futex"


def test_a_wait_for_the_engine_without_its_record_is_the_engines_unknown_phase():
    from tailgate.diagnose.chain import through_engine
    from tailgate.diagnose.engine import Windows

    lines, starts, ends, win = engine_server()
    _, _, _, bl = run(lines, starts, ends, service=(101, 102, 110))
    unplaced = Windows(*(np.where(np.arange(len(starts)) == 0, 0, v)
                         for v in (win.sent, win.prefill_start, win.anchor, win.decode_end,
                                   win.queue_start)))
    through_engine(bl, unplaced)
    assert bl.per_request[0][0].signature == ("futex", "engine")
    assert bl.per_request[10][0].signature == ("futex", "engine_queue")


def test_a_wait_for_the_engine_while_it_was_idle_is_held_in_the_server_not_queued():
    """The same slow requests' 6 ms before the prefill, with the engine stating no queue and
    working on no other request meanwhile: the request was still in the server's hands
    (held, L3, as diagnose.engine splits it), never the engine's queue (before, the whole
    wait from the send to the prefill was engine_queue)."""
    from tailgate.diagnose.chain import describe, remedy, through_engine
    from tailgate.diagnose.engine import Windows

    lines, starts, ends, win = engine_server(stated=False)
    ev, s, e, bl = run(lines, starts, ends, service=(101, 102, 110))
    through_engine(bl, win)
    (c,) = bl.per_request[0]
    assert c.signature == ("futex", "engine_held")
    a = int(s[0])
    assert (c.links[1].tid, c.links[1].a, c.links[1].b) == (110, a + MS // 5, a + 6 * MS)
    assert "its waker `srv` (tid 110) idle, the request not yet handed to it" in describe(
        c, {}, {SVC}), describe(c, {}, {SVC})
    assert remedy(c).startswith("See the host's causes of the server's threads")
    (sig,) = [x for x in judge(bl, s, e, CRIT, {}, {SVC})["signatures"]
              if x["links"] == ["futex", "engine_held"]]
    assert sig["layer"] == "L3"
    # another request's prefill and decode over the same 6 ms: the engine's queue
    busy = Windows(win.sent, win.prefill_start, win.anchor, win.decode_end)
    assert busy.phase(0, a, a + 6 * MS)[0] == "held"
    other = np.zeros(len(s), bool)
    other[1] = True
    behind = Windows(*(np.where(other, v, w) for v, w in zip(
        (a + MS, a + MS, a + 2 * MS, a + 7 * MS),
        (win.sent, win.prefill_start, win.anchor, win.decode_end), strict=True)))
    assert behind.phase(0, a, a + 6 * MS) == ("queue", a, a + 6 * MS)


def test_a_span_holding_a_requests_whole_window_is_none_of_its_evidence():
    """Thread 1 (the only one of both requests' pool) waits from 0 to 200: request 0
    ([10, 50]) began and ended inside that wait, so the thread did nothing for it; request
    1 ([100, 250]) it served after the wait. What was counted is clipped to the windows."""
    from tailgate.diagnose.chain import Scope, owned

    s, e = np.array([10, 100], np.int64), np.array([50, 250], np.int64)
    by = {1: np.array([[0, 200]])}
    for scope in ([Scope((1,)), Scope((1,))], [Scope((1,), ((2, 0, 1),)), Scope((1,))]):
        own = owned(s, e, scope, by)
        assert own.hit.tolist() == [False, True] and own.inside.tolist() == [0, 100]
        assert own.spans.tolist() == [[100, 200]] and own.threads == 1


def test_a_wait_every_request_has_for_the_engines_decode_explains_no_tail():
    """Every request's HTTP thread waits for the engine's decode for most of its latency
    (slow or not): the chain is everywhere, and the pervasive rule, which claims a wait that
    lasted most of the slow requests' latency, does not hold for the engine's phases."""
    from tailgate.diagnose.chain import through_engine
    from tailgate.diagnose.engine import Windows

    lines = names(101, 110)
    starts, ends = [], []
    win = [np.zeros(200, np.int64) for _ in range(4)]
    for i in range(200):
        lat = 10 if i % 10 == 0 else 2
        rl, a, b = request(i, 40000 + i % 4, 101, lat)
        lines += rl + [f"O 101 {a + MS // 5} {b - MS // 10} 202",
                       f"F 101 {a + MS // 5} {b - MS // 10}",
                       f"W 101 {b - MS // 10 - 10_000} 110 {SVC} 1 0 srv"]
        for k, v in enumerate((a, a + MS // 10, a + MS // 10 + 50_000, b - MS // 20)):
            win[k][i] = v
        starts.append(a)
        ends.append(b)
    _, s, e, bl = run(lines, starts, ends, service=(101, 110))
    through_engine(bl, Windows(*win))
    assert {c.signature for cs in bl.per_request for c in cs} == {("futex", "engine_decode")}
    out = judge(bl, s, e, CRIT, {}, {SVC})
    (sig,) = out["signatures"]
    assert sig["tail_time_share"] >= 0.5 and sig["lift"] == 1 and not sig["claimed"], sig
    assert out["verdict"] is None


def test_a_wait_for_work_counts_only_inside_the_request():
    """The serving thread waited on a futex from 0 to 30 (for a job: the request, sent at 12,
    came to it at 30), then 35-45 inside the request, then from 48 on, done with it (the
    reply reached the kernel at 47): only 35-45 is the request's, as its chains take it."""
    from tailgate.diagnose.chain import Scope, owned

    s, e = np.array([10], np.int64), np.array([60], np.int64)
    by = {1: np.array([[0, 30], [35, 45], [48, 80]])}
    own = owned(s, e, [Scope((1,))], by, (np.array([12]), np.array([47])))
    assert own.hit.tolist() == [True] and own.inside.tolist() == [10]
    assert own.spans.tolist() == [[35, 45]] and own.threads == 1
    # as evidence of any other kind, all of it overlapping the request counts
    assert owned(s, e, [Scope((1,))], by).inside.tolist() == [20 + 10 + 12]


def test_the_accounting_names_a_wait_for_the_engine_as_such_not_as_a_futex():
    """The per-thread time accounting of the same server: the HTTP thread's futex waits that
    the chain resolved to the engine are the part "waits on the engine (futex)" (JSON key
    engine_wait) in the terminal, the HTML and the JSON alike; the lock wait of request 5
    stays futex; together they are what futex was before (every time the same)."""
    import io

    from rich.console import Console

    from tailgate.diagnose.accounting import account, summarise
    from tailgate.diagnose.analyse import _threads
    from tailgate.diagnose.chain import through_engine
    from tailgate.diagnose.evidence import ProbeMaps
    from tailgate.report.diagnose_html import accounting_section
    from tailgate.report.diagnose_render import accounting as render

    lines, starts, ends, win = engine_server()
    ev, s, e, bl = run(lines, starts, ends, service=(101, 102, 110))
    maps = ProbeMaps(switches={101: {"voluntary": 21, "involuntary": 0}})
    end = int(e[-1])
    before = account(s, e, None, _threads(ev, maps, s, e, end), {})
    acc = account(s, e, None, _threads(ev, maps, s, e, end, through_engine(bl, win)), {})
    wait = 9 * MS - MS // 5  # each wait: 0.2 ms to 9 ms into its request, on thread 101
    i = np.arange(len(s))
    assert acc.parts["engine_wait"].tolist() == np.where(i % 10 == 0, wait, 0).tolist()
    assert acc.parts["futex"].tolist() == np.where(i == 5, wait, 0).tolist()
    assert (acc.parts["futex"] + acc.parts["engine_wait"]).tolist() == before.parts[
        "futex"].tolist()
    assert before.parts["engine_wait"].sum() == 0
    doc = summarise(acc)
    assert doc["labels"] == {"engine_wait": "waits on the engine (futex)"}
    assert doc["grows_most"] == "engine_wait"
    assert "waits on the engine (futex) grows most: 8.381 ms a request" in doc["sentence"]
    out = io.StringIO()
    render(doc, Console(file=out, width=200, color_system=None))
    rows = {line.split("  ")[1].strip(): line for line in out.getvalue().splitlines()
            if line.startswith("  ") and not line.startswith("  part")}
    assert "waits on the engine (futex)" in rows and "futex" in rows, out.getvalue()
    assert "engine_wait" not in out.getvalue()
    html = accounting_section({**doc, "slowest": [{"latency_ms": 10.0, "candidates": 1,
                                                   "parts_ms": {"engine_wait": 8.8}}]})
    assert "<td>waits on the engine (futex)</td>" in html and "<td>futex</td>" in html
    assert "waits on the engine (futex) 8.800" in html


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3_000)), max_size=60),
       st.integers(-100, 14_000), st.integers(0, 4_000))
def test_a_tasks_waits_overlapping_a_window_are_found_by_bisection_as_by_a_scan(rows, a, span):
    """Tracks.overlapping bisects both ends of a task's waits (a busy thread has ~10^5, and
    every link of every chain asks): it finds exactly the waits a scan of all of them finds,
    in the same order, overlapping or nested waits included."""
    from tailgate.diagnose.chain import Tracks
    from tailgate.diagnose.evidence import Events

    ev = Events(offcpu=[(7, s, s + d, 202) for s, d in rows])
    tr = Tracks.of(ev, {7})
    b = a + span
    scan = [w for w in tr.waits.get(7, []) if w.a <= b and w.b > a]
    assert tr.overlapping(7, a, b) == scan
