"""The tail-differential profile's logic with known answers (diagnose.profile, report.flame):
which thread time is the slow requests', how samples and waits are split and ranked, what the
notes say about stacks that cannot be trusted."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tailgate.diagnose.profile import Frame, Samples, differential, notes, program, serving_sets, wait_site
from tailgate.report.flame import flame_section, flame_tree

MS = 1_000_000


def frames(*names: str, module: str = "slowpath") -> tuple[Frame, ...]:
    """Leaf first, as bpftrace prints them."""
    return tuple(Frame(n, "kernel" if module == "kernel" else module) for n in names)


ROOT = ("main", "start_thread", "clone3")
WAITS_1 = np.array([[0, 1000], [1500, 3000], [3200, 10000]], np.int64) * MS


def threads() -> dict[int, dict[str, np.ndarray]]:
    return {1: {"read": WAITS_1},
            2: {"poll": np.array([[0, 10000]], np.int64) * MS}}  # idle the whole time


def two_requests():
    starts = np.array([900, 2900], np.int64) * MS
    ends = np.array([1600, 3300], np.int64) * MS
    return starts, ends


def test_serving_time_is_the_window_less_the_wait_for_it_and_the_wait_after_it():
    starts, ends = two_requests()
    sets = serving_sets(starts, ends, None, threads(), p99_ns=700 * MS)
    assert sets.slow.tolist() == [True, False]
    # A [900, 1600]: waiting for it until 1000, back to waiting at 1500
    assert sets.tail[1].tolist() == [[1000 * MS, 1500 * MS]]
    # B [2900, 3300]: the wait until 3000, the next from 3200
    assert sets.rest[1].tolist() == [[3000 * MS, 3200 * MS]]
    # thread 2 waited for work through both windows: it served neither
    assert len(sets.tail[2]) == 0 and len(sets.rest[2]) == 0
    assert sets.mode.tolist() == [1, 1]  # one busy thread each: followed per thread


def test_several_busy_threads_make_the_split_service_wide():
    starts, ends = two_requests()
    th = threads()
    th[3] = {"read": np.array([[0, 950], [1200, 10000]], np.int64) * MS}  # busy 950-1200
    sets = serving_sets(starts, ends, None, th, p99_ns=700 * MS)
    assert sets.mode.tolist() == [2, 1]
    assert sets.tail[3].tolist() == [[950 * MS, 1200 * MS]]


def test_the_send_time_starts_the_window_not_the_intended_start():
    starts, ends = two_requests()
    sends = np.array([1100, 0], np.int64) * MS  # A sent late: its window begins at 1100
    sets = serving_sets(starts, ends, sends, threads(), p99_ns=700 * MS)
    assert sets.tail[1].tolist() == [[1100 * MS, 1500 * MS]]


def samples() -> Samples:
    burn = frames("slow_burn", "handle", "conn", *ROOT)
    sleep_k = frames("__schedule", "schedule", "do_nanosleep", "hrtimer_nanosleep",
                     "__x64_sys_clock_nanosleep", "do_syscall_64", module="kernel")
    sock_k = frames("__schedule", "schedule", "schedule_timeout", "tcp_recvmsg",
                    "sock_read_iter", "vfs_read", "ksys_read", "do_syscall_64", module="kernel")
    s = Samples(hz=1000)
    s.on = [(1, 1100 * MS, (), burn), (1, 1200 * MS, (), burn),
            (1, 3050 * MS, (), frames("handle", "conn", *ROOT)),
            (2, 5000 * MS, (), frames("poll", *ROOT))]  # outside every serving time
    s.off = [(1, 1300 * MS, 1400 * MS, 230, sleep_k,
              (Frame("clock_nanosleep", "libc.so.6"), *frames("slow_sleep", "handle", "conn",
                                                              *ROOT))),
             (1, 3100 * MS, 3150 * MS, 0, sock_k, frames("read", "conn", *ROOT)),
             (2, 0, 10000 * MS, 7, (), frames("poll", *ROOT))]
    s.taken_on, s.taken_off = 4, 3
    return s


def test_the_differential_ranks_the_injected_wait_first_with_exact_shares():
    starts, ends = two_requests()
    prof = differential(samples(), serving_sets(starts, ends, None, threads(), 700 * MS))
    assert prof["tail"] == {"serving_ms": 500.0, "profiled_ms": 102.0}
    assert prof["rest"] == {"serving_ms": 200.0, "profiled_ms": 51.0}
    first, second = prof["ranked"]
    assert (first["state"], first["syscall"], first["part"], first["site"]) == \
        ("off CPU", "clock_nanosleep", "sleep", "do_nanosleep")
    assert first["tail_ms"] == 100.0 and first["rest_ms"] == 0.0
    assert first["tail_share"] == round(100 / 102, 4) and first["rest_share"] == 0.0
    # the 4 leaf-most frames of the service's own, the syscall's wrapper in libc left out
    assert first["from"] == "main → conn → handle → slow_sleep"
    assert first["user"][:2] == ["clock_nanosleep", "slow_sleep"]  # the whole stack kept
    assert (second["state"], second["tail_ms"], second["module"]) == ("on CPU", 2.0, "slowpath")
    assert second["from"] == "main → conn → handle → slow_burn"
    # what the rest had more of: the socket read between requests, the fast path's CPU
    assert [r["syscall"] for r in prof["under"]] == ["read", None]
    assert prof["under"][0]["rest_share"] == round(50 / 51, 4)
    assert prof["split"]["how"] == "per thread" and prof["split"]["per_thread"] == 1
    assert prof["dropped"] == {"samples": 0, "waits": 0}
    assert prof["sentence"] == (
        "in the slowest 1 % (1 requests above the P99, per thread): 98 % of the service's "
        f"profiled time off CPU in clock_nanosleep (do_nanosleep) from {first['from']}, "
        "against 0 % otherwise")


def test_frames_in_an_interpreter_are_ranked_under_the_interpreter():
    py = "libpython3.11.so.1.0"
    s = Samples(hz=1000)
    s.on = [(1, 1100 * MS, (), (Frame("long_mul", py), Frame("[unknown]", "[unknown]"))),
            (1, 1200 * MS, (), (Frame("_PyEval_EvalFrameDefault", py),)),
            (1, 1300 * MS, (), (Frame("__vdso_clock_gettime", "[vdso]"),
                                Frame("time_thread_time", py)))]
    starts, ends = two_requests()
    prof = differential(s, serving_sets(starts, ends, None, threads(), 700 * MS))
    (row,) = prof["ranked"]
    assert row["from"] == f"the Python interpreter ({py})" and row["tail_ms"] == 3.0
    assert row["tail_share"] == 1.0 and row["module"] == py
    assert any(n.startswith("a Python service") for n in prof["notes"])


def test_a_stack_of_library_frames_only_says_its_caller_was_not_seen():
    from tailgate.diagnose.profile import row_key

    libc = (Frame("read", "libc.so.6"), Frame("[unknown]", "libc.so.6"))
    assert row_key(libc)[1] == "read in libc.so.6 (its caller not seen: no frame pointer)"
    assert row_key(())[1] == "(no user stack)"
    # the vDSO and libc at the leaf, the thread's start at the root, are left out
    u = (Frame("[unknown]", "[vdso]"), Frame("clock_gettime", "libc.so.6"),
         *frames("cpu_us", "slow_burn"), Frame("[unknown]", "libc.so.6"))
    assert row_key(u) == (("cpu_us", "slow_burn"), "slow_burn → cpu_us")


def test_a_full_map_is_said():
    s = samples()
    s.taken_on = 10
    starts, ends = two_requests()
    prof = differential(s, serving_sets(starts, ends, None, threads(), 700 * MS))
    assert prof["dropped"] == {"samples": 6, "waits": 0}


def test_flame_tree_sums_are_inclusive_and_coloured_by_excess():
    folded = [{"frames": ["off CPU: nanosleep", "conn", "slow_sleep"], "tail_ms": 90.0,
               "rest_ms": 0.0},
              {"frames": ["on CPU", "conn", "handle"], "tail_ms": 10.0, "rest_ms": 50.0}]
    t = flame_tree(folded)
    node = dict(zip(t["ids"], zip(t["tail_ms"], t["rest_ms"], t["excess"], strict=True),
                    strict=True))
    assert node["all"] == (100.0, 50.0, 0.0)
    assert node["all\x1foff CPU: nanosleep\x1fconn\x1fslow_sleep"] == (90.0, 0.0, 90.0)
    assert node["all\x1fon CPU"] == (10.0, 50.0, -90.0)
    assert t["parents"][t["ids"].index("all\x1fon CPU\x1fconn")] == "all\x1fon CPU"


def test_flame_section_draws_the_graph_and_the_table():
    starts, ends = two_requests()
    prof = differential(samples(), serving_sets(starts, ends, None, threads(), 700 * MS))
    html = flame_section(prof)
    assert "id='profile-ranked'" in html and 'id="flame"' in html
    assert "slow_sleep" in html and "do_nanosleep" in html
    assert flame_section(None) == ""
    assert "not measured" in flame_section({"unknown": "passive mode"})


def test_wait_site_skips_the_scheduler():
    assert wait_site(frames("__schedule", "schedule", "schedule_hrtimeout_range",
                            "do_epoll_wait", module="kernel")) == "do_epoll_wait"
    assert wait_site(frames("pipe_read", module="kernel")) == "pipe_read"
    assert wait_site(()) is None


def test_notes_say_what_the_stacks_cannot_show():
    s = Samples(hz=99)
    # walks that end in libpython, far from the thread's start; frames without symbols
    s.on = [(1, i, (), (Frame("_PyEval_EvalFrameDefault", "libpython3.11.so.1.0"),
                        Frame("[unknown]", "libfoo.so")))
            for i in range(10)]
    text = "\n".join(notes(s))
    assert "100 % of the frames in libfoo.so have no symbol" in text
    assert "100 % of the user stacks stop before the thread's first frame" in text
    assert "-fno-omit-frame-pointer" in text
    assert "a Python service: the user frames are its interpreter's" in text
    # complete stacks with symbols: nothing to say
    s.on = [(1, 0, (), frames("slow_burn", "handle", "conn", *ROOT))]
    assert notes(s) == []


def test_program_rate_is_validated_and_written_once():
    text = program(499)
    assert "\nprofile:hz:499\n" in text and "\nprofile:hz:997\n" not in text
    for bad in (0, 5000, 1.5, True, "99"):
        with pytest.raises(ValueError):
            program(bad)


@pytest.mark.parametrize("args, message", [
    (("--profile-hz", "99"), "--profile-hz needs --profile"),
    (("--profile", "--profile-hz", "0"), "--profile-hz must be between 1 and 4999"),
    (("--profile", "--profile-hz", "5000"), "--profile-hz must be between 1 and 4999")])
def test_a_bad_profile_rate_is_a_usage_error(args, message):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tailgate", "diagnose", "tcp://127.0.0.1:9",
                          "--pid", str(os.getpid()), "--duration", "1s", *args],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_the_probes_real_output_parses():
    """diagnose_profile.bt's output against slowpath (cpu mode) on this kernel, its maps cut
    to 6 samples and 3 waits (the counters are the run's: 42 and 20). Its connection thread
    had exited when bpftrace printed, so every user frame is an address ("[unknown]")."""
    from pathlib import Path

    from tailgate.diagnose.profile import ATTACHED, parse_samples
    from tailgate.probes.output import parse_output

    text = (Path(__file__).parent / "fixtures/probes/diagnose_profile.jsonl").read_text()
    out = parse_output(text)
    assert out.printf == (ATTACHED + "\n",)
    s = parse_samples(out, 997)
    assert (len(s.on), len(s.off), s.taken_on, s.taken_off, s.malformed) == (6, 3, 42, 20, 0)
    assert set(s.tgid.values()) == {20106}
    tid, t, k, u = s.on[0]
    assert t > 0 and all(f.module == "kernel" and f.named for f in k)
    assert [f.name for f in k][-1] == "entry_SYSCALL_64_after_hwframe"
    assert u and all(not f.named and f.module == "[unknown]" and f.addr > 0 for f in u)
    # the waits: a socket read, blocked in tcp_recvmsg
    tid, a, b, nr, k, u = s.off[0]
    assert b - a >= 200_000 and nr == 0
    assert wait_site(k) == "tcp_recvmsg_locked"  # below the generic wait helpers


def test_a_thread_exit_line_parses_and_a_bad_one_is_counted():
    from tailgate.diagnose.evidence import parse_events

    ev = parse_events(["X 4242 15784440405305\nX 4243 -1\nX 4244\n"])
    assert ev.exits == {4242: 15784440405305} and ev.malformed == 2


def test_the_page_shows_each_slow_requests_time_accounted():
    from tailgate.diagnose.accounting import account, summarise
    from tailgate.report.diagnose_html import accounting_section

    starts = np.arange(100, dtype=np.int64) * 10 * MS
    ends = starts + MS + np.arange(100, dtype=np.int64) * 1000  # 1 ms and a little more
    ends[50] = starts[50] + 8 * MS  # the slow one: 7 ms of it asleep
    sleep = np.array([[starts[50] + MS // 2, starts[50] + 7 * MS + MS // 2]], np.int64)
    acc = account(starts, ends, None, {1: {"sleep": sleep}}, {})
    summary = summarise(acc)
    summary["slowest"] = [{"latency_ms": 8.0, "candidates": 1,
                           "parts_ms": {"sleep": 7.0, "on_cpu": 1.0}}]
    html = accounting_section(summary)
    assert summary["grows_most"] == "sleep"
    assert "<tr class='worse'><td>sleep</td>" in html
    assert "sleep 7.000, on_cpu 1.000" in html
    assert accounting_section(None) == ""
