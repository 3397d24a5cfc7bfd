"""The tail-differential profile (pure): where the service's threads spent the slow requests'
time against the other requests', by on-CPU stack and by off-CPU wait (syscall and stacks).

Input: the samples and waits of ``diagnose_profile.bt`` (each with its thread, its time and its
kernel and user stack, symbolised by bpftrace), the requests' windows, and each thread's waits
for work from the main probe (the accounting's ``threads``). Each request's window is served
on some threads; which one is not recorded, so, as in the accounting (diagnose.accounting):

- a thread is a *candidate* for a request when it was busy in its window (not the whole window
  in a wait for work: futex, read, write, poll, other waits, or not yet seen);
- on a candidate, the request's *serving time* is its window less the wait under way when the
  request was sent (the thread waiting for it to arrive) and less a wait begun inside it and
  lasting past its end (the thread done: back to waiting for work);
- one candidate: the request is followed on that thread (``thread``, exact); several: on every
  candidate (``service``: the service's busy threads, which one served it not known); none: no
  thread of the service was busy in its window and nothing of the profile is its (``none``).

The *tail* set of each thread is the union of the serving times of the requests at or above
the P99; the *rest* set the union of the other requests' serving times, less the tail. An
on-CPU sample counts 1/hz s of its thread's CPU time in the set its time falls in; an off-CPU
wait counts its overlap with each set. Each stack's share of a set is its time over the set's
profiled time (samples + waits); what is over-represented in the tail is the share in the tail
less the share in the rest, ranked.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model import ParseError, SourceError
from ..probes.output import BpftraceOutput, int_key, split_key
from ..probes.symbols import Symbolizer, demangle
from ..spans import merge_spans, overlap_ns, subtract_spans
from .accounting import WAITS, syscall_class

DEFAULT_HZ = 997  # see docs/diagnose-accounting.md: the overhead measured at this rate
MAX_HZ = 4999
TEMPLATE_RATE = "profile:hz:997"
MAX_RANKED = 15
MAX_FOLDED = 400
ATTACHED = "tailgate-profile: attached"

# a frame in bpftrace's perf format: "ffffffff8a1b2c3d __schedule+1037" (kernel),
# "7f31f9b352ec __libc_read+76 (/usr/lib/x86_64-linux-gnu/libc.so.6)" (user), or unnamed
# "7f90d024a2ec 0x7f90d024a2ec ([unknown])"
_FRAME = re.compile(r"^\s*(?P<addr>[0-9a-fA-F]+)\s+(?P<sym>\S.*?)(?:\s+\((?P<mod>[^()]*)\))?\s*$")
_OFFSET = re.compile(r"\+(0x[0-9a-fA-F]+|\d+)$")
# where a user stack walked to the end: a thread's or the process's first frame
THREAD_ROOTS = ("clone3", "clone", "__clone", "__clone3", "_start", "start_thread",
                "__libc_start_main", "__libc_start_call_main")
INTERPRETERS = {"_PyEval_EvalFrameDefault": "Python", "PyEval_EvalCode": "Python",
                "ruby_exec_node": "Ruby", "rb_vm_exec": "Ruby", "luaV_execute": "Lua"}
# syscall names for the table (x86_64): the accounting's classes name the rest
_NAMES = {0: "read", 1: "write", 7: "poll", 17: "pread64", 19: "readv", 20: "writev",
          23: "select", 34: "pause", 35: "nanosleep", 43: "accept", 45: "recvfrom",
          44: "sendto", 46: "sendmsg", 47: "recvmsg", 202: "futex", 230: "clock_nanosleep",
          232: "epoll_wait", 281: "epoll_pwait", 288: "accept4", 270: "pselect6",
          271: "ppoll", 295: "preadv", 296: "pwritev", 441: "epoll_pwait2", 61: "wait4"}


def program(hz: int) -> str:
    """diagnose_profile.bt with the sampling rate ``hz`` (an integer, validated here)."""
    from ..probes.driver import program_text

    if not isinstance(hz, int) or isinstance(hz, bool) or not 1 <= hz <= MAX_HZ:
        raise ValueError(f"the profile's rate must be an integer from 1 to {MAX_HZ} Hz, "
                         f"not {hz!r}")
    text, n = re.subn(rf"^{TEMPLATE_RATE}$", f"profile:hz:{hz}",
                      program_text("diagnose_profile"), flags=re.M)
    if n != 1:
        raise AssertionError("diagnose_profile.bt has no single profile:hz:997 probe")
    return text


@dataclass(frozen=True)
class Frame:
    name: str  # the symbol without its offset, or "[unknown]"
    module: str  # the file's base name ("kernel" for the kernel, "[unknown]": not known)
    addr: int = field(default=0, compare=False)

    @property
    def named(self) -> bool:
        return self.name != "[unknown]" and not self.name.startswith("0x")

    def label(self) -> str:
        return self.name if self.name != "[unknown]" else f"[unknown] ({self.module})"


def parse_stack(text: str, kernel: bool = False) -> tuple[Frame, ...]:
    """bpftrace's perf-format stack (leaf first) as frames, leaf first. A line that is not a
    frame raises ValueError (the caller counts it)."""
    frames = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _FRAME.match(line)
        if m is None:
            raise ValueError(f"not a stack frame: {line!r}")
        sym = _OFFSET.sub("", m["sym"].strip()) or "[unknown]"
        if sym.startswith("0x"):
            sym = "[unknown]"
        mod = m["mod"] or ("kernel" if kernel else "[unknown]")
        mod = "kernel" if kernel or mod == "[kernel.kallsyms]" else os.path.basename(mod) or mod
        frames.append(Frame(sym, mod, int(m["addr"], 16)))
    return tuple(frames)


@dataclass
class Samples:
    """The profile probe's output: on-CPU samples and off-CPU waits, stacks leaf first."""

    hz: int
    on: list[tuple[int, int, tuple[Frame, ...], tuple[Frame, ...]]] = field(
        default_factory=list)  # tid, t, kernel, user
    off: list[tuple[int, int, int, int, tuple[Frame, ...], tuple[Frame, ...]]] = field(
        default_factory=list)  # tid, start, end, syscall, kernel, user
    taken_on: int = 0  # counted by the probe (more than len(on): a full map dropped some)
    taken_off: int = 0
    malformed: int = 0
    tgid: dict[int, int] = field(default_factory=dict)  # thread -> its process
    named_by_tailgate: int = 0  # user frames bpftrace left unnamed, named by name_frames


def _split_stacks(rest: str) -> tuple[str, str]:
    """``kstack,ustack``: kernel symbols hold no comma, so the first one separates them."""
    k, sep, u = rest.partition(",")
    if not sep:
        raise ValueError("no user stack in the key")
    return k, u


def parse_samples(output: BpftraceOutput, hz: int) -> Samples:
    """The maps of diagnose_profile.bt (pure)."""
    s = Samples(hz, taken_on=output.scalar("@on_n") or 0, taken_off=output.scalar("@off_n") or 0)
    for key, n in output.map("@on").items():
        try:
            tg, tid, t, rest = split_key(key, 4)
            k, u = _split_stacks(rest)
            row = (int_key(tid), int_key(t), parse_stack(k, kernel=True), parse_stack(u))
            s.tgid[row[0]] = int_key(tg)
        except (ValueError, ParseError):
            s.malformed += 1
            continue
        s.on.extend([row] * int(n))
    for key, _ in output.map("@off").items():
        try:
            tg, tid, a, b, nr, rest = split_key(key, 6)
            k, u = _split_stacks(rest)
            row = (int_key(tid), int_key(a), int_key(b), int_key(nr),
                   parse_stack(k, kernel=True), parse_stack(u))
            if row[2] < row[1]:
                raise ValueError(key)
            s.tgid[row[0]] = int_key(tg)
        except (ValueError, ParseError):
            s.malformed += 1
            continue
        s.off.append(row)
    s.on.sort(key=lambda r: (r[0], r[1]))
    s.off.sort(key=lambda r: (r[0], r[1]))
    return s


def name_frames(s: Samples, proc: str = "/proc") -> int:
    """Name the user frames bpftrace left as addresses (their thread had exited when it
    printed) from their process's maps and ELF symbols, while it still runs; returns how many
    were named."""
    wanted: dict[int, set[int]] = defaultdict(set)
    for tid, *_, u in [*s.on, *s.off]:
        for f in u:
            if not f.named and tid in s.tgid:
                wanted[s.tgid[tid]].add(f.addr)
    names: dict[tuple[int, int], Frame] = {}
    for pid, addrs in wanted.items():
        try:
            sym = Symbolizer(pid, proc)
        except (SourceError, ValueError):  # exited: its frames stay addresses
            continue
        for addr in addrs:
            path = sym.path(addr)
            if path is None:
                continue
            found = sym(addr) if path.startswith("/") else None
            names[pid, addr] = Frame(demangle(found[0]) if found else "[unknown]",
                                     os.path.basename(path), addr)

    def fix(tid: int, u: tuple[Frame, ...]) -> tuple[Frame, ...]:
        pid = s.tgid.get(tid)
        return tuple(f if f.named else names.get((pid, f.addr), f) for f in u)

    before = sum(f.named for *_, u in [*s.on, *s.off] for f in u)
    s.on = [(tid, t, k, fix(tid, u)) for tid, t, k, u in s.on]
    s.off = [(tid, a, b, nr, k, fix(tid, u)) for tid, a, b, nr, k, u in s.off]
    return sum(f.named for *_, u in [*s.on, *s.off] for f in u) - before


# -- which thread time belongs to which set ------------------------------------------------------

@dataclass(frozen=True)
class Sets:
    """Per thread: its serving time for the slow requests (``tail``) and for the others
    (``rest``), sorted disjoint spans; how each request was followed."""

    tail: dict[int, np.ndarray]
    rest: dict[int, np.ndarray]
    mode: np.ndarray  # per request: 1 one thread, 2 several (the service's busy threads), 0 none
    slow: np.ndarray  # bool per request


def _serving(w: np.ndarray, d: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """On a thread whose waits for work are ``w`` (sorted, disjoint): each window ``[d, e]``
    less the wait under way at ``d`` and less one begun inside it and lasting past ``e``."""
    lo, hi = d.copy(), e.copy()
    if len(w):
        i = np.searchsorted(w[:, 0], d, side="right") - 1  # the last wait begun at or before d
        ok = (i >= 0) & (w[np.maximum(i, 0), 1] > d)
        lo[ok] = np.minimum(w[i[ok], 1], e[ok])
        j = np.searchsorted(w[:, 0], e, side="left") - 1  # the last wait begun before e
        ok = (j >= 0) & (w[np.maximum(j, 0), 0] > lo) & (w[np.maximum(j, 0), 1] >= e)
        hi[ok] = w[j[ok], 0]
    return lo, np.maximum(hi, lo)


def serving_sets(starts: np.ndarray, ends: np.ndarray, sends: np.ndarray | None,
                 threads: dict[int, dict[str, np.ndarray]], p99_ns: float) -> Sets:
    """The tail and rest sets per thread (module docstring). ``threads``: the accounting's
    per-thread intervals by part (its waits for work are those of :data:`WAITS` and
    ``unseen``)."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    n = len(starts)
    sends = np.zeros(n, np.int64) if sends is None else np.asarray(sends, np.int64)
    d = np.where(sends > 0, np.clip(sends, starts, ends), starts)
    slow = (ends - starts) >= p99_ns
    waits: dict[int, np.ndarray] = {}
    busy: dict[int, np.ndarray] = {}
    for tid, kinds in threads.items():
        idle = [np.asarray(kinds[k], np.int64).reshape(-1, 2) for k in (*WAITS, "unseen")
                if k in kinds]
        w = merge_spans(np.concatenate(idle)) if idle else np.zeros((0, 2), np.int64)
        waits[tid] = w
        busy[tid] = (ends - d) - overlap_ns(d, ends, w) > 0
    cand = sum((b.astype(np.int64) for b in busy.values()), np.zeros(n, np.int64))
    mode = np.minimum(cand, 2)
    tail: dict[int, np.ndarray] = {}
    rest: dict[int, np.ndarray] = {}
    for tid, w in waits.items():
        lo, hi = _serving(w, d, ends)
        keep = busy[tid] & (hi > lo)
        t = merge_spans(np.stack([lo[keep & slow], hi[keep & slow]], axis=1))
        r = merge_spans(np.stack([lo[keep & ~slow], hi[keep & ~slow]], axis=1))
        tail[tid] = t
        rest[tid] = subtract_spans(r, t) if len(t) else r
    return Sets(tail, rest, mode, slow)


# -- the differential --------------------------------------------------------------------------

_SYSTEM = re.compile(r"^(libc[.-]|ld-linux|\[vdso\]|\[vsyscall\]|libpthread[.-]|libm[.-]|"
                     r"libdl[.-])")
_INTERP = re.compile(r"(python|ruby|node|lua|perl)", re.I)
# the scheduler's frames and the generic wait helpers above it (the site is their caller)
_SCHED = re.compile(r"schedule|^__traceiter|^finish_task_switch|^context_switch|^wait_woken$|"
                    r"^sk_wait_data$|^prepare_to_wait|^finish_wait$")


def wait_site(kernel: tuple[Frame, ...]) -> str | None:
    """The kernel function a wait is in: the first frame (leaf first) that is not the
    scheduler's own."""
    for f in kernel:
        if not _SCHED.search(f.name):
            return f.name
    return None


def _syscall_label(nr: int) -> str:
    return "no syscall" if nr == -1 else _NAMES.get(nr, f"syscall {nr}")


def _in(spans: np.ndarray, t: np.ndarray) -> np.ndarray:
    if not len(spans) or not len(t):
        return np.zeros(len(t), dtype=bool)
    i = np.searchsorted(spans[:, 0], t, side="right") - 1
    return (i >= 0) & (t < spans[np.maximum(i, 0), 1])


def _overlap(a: np.ndarray, b: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """How long each ``[a, b]`` overlaps ``spans`` (sorted, disjoint: no merge needed)."""
    if not len(spans) or not len(a):
        return np.zeros(len(a), np.int64)
    before = np.concatenate([[0], np.cumsum(spans[:, 1] - spans[:, 0])])

    def upto(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(spans[:, 0], t, side="right") - 1
        out = np.zeros(len(t), np.int64)
        ok = i >= 0
        out[ok] = before[i[ok]] + np.minimum(t[ok], spans[i[ok], 1]) - spans[i[ok], 0]
        return out

    return upto(b) - upto(a)


def _system(f: Frame) -> bool:
    return bool(_SYSTEM.match(f.module))


def _root(f: Frame) -> bool:
    """A thread's first frame: named so, or unnamed in libc (glibc's start_thread is a local
    symbol, absent from a stripped libc)."""
    return f.name in THREAD_ROOTS or (_system(f) and not f.named)


def interpreter(module: str) -> str | None:
    m = _INTERP.search(module)
    return m.group(1).capitalize() if m else None


def row_key(user: tuple[Frame, ...], depth: int = 4) -> tuple[tuple[str, ...], str]:
    """What a stack is ranked under, and how that reads: its leaf-most frames, caller first
    (``conn → handle → slow_read_file``), less the system libraries' frames at the leaf (the
    syscall's wrapper, the vDSO: the syscall and the state say what they did). A leaf in an
    interpreter is ranked under the interpreter: its frames say nothing of the program's."""
    own = user
    while own and (_system(own[0]) or own[0].module == "[unknown]"):  # a vDSO can show so
        own = own[1:]
    while own and _root(own[-1]):  # the thread's start says nothing of where it was
        own = own[:-1]
    if not user:
        return (), "(no user stack)"
    if not own:  # only a library's frames: the walk lost the caller (no frame pointer)
        leaf = user[0]
        return ((leaf.label(), leaf.module),
                f"{leaf.label()} in {leaf.module} (its caller not seen: no frame pointer)")
    lang = interpreter(own[0].module)
    if lang:
        return (f"[{own[0].module}]",), f"the {lang} interpreter ({own[0].module})"
    key = tuple(f.label() for f in own[:depth])
    return key, " → ".join(reversed(key))


def differential(samples: Samples, sets: Sets) -> dict[str, Any]:
    """Time per stack in the tail and the rest sets, ranked by over-representation in the
    tail; folded stacks for the flame graph; notes on what the stacks could not show."""
    period_ns = 1e9 / samples.hz
    # key -> [tail ns, rest ns]; key: (state, syscall, kernel frames, user frames)
    acc: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    empty = np.zeros((0, 2), np.int64)
    by_tid: dict[int, list[int]] = defaultdict(list)
    for i, row in enumerate(samples.on):
        by_tid[row[0]].append(i)
    for tid, idx in by_tid.items():
        t = np.array([samples.on[i][1] for i in idx], dtype=np.int64)
        in_tail = _in(sets.tail.get(tid, empty), t)
        in_rest = _in(sets.rest.get(tid, empty), t)
        for i, a, b in zip(idx, in_tail, in_rest, strict=True):
            if a or b:
                _, _, k, u = samples.on[i]
                acc[("on", None, k, u)][0 if a else 1] += period_ns
    waits: dict[int, list[int]] = defaultdict(list)
    for i, row in enumerate(samples.off):
        waits[row[0]].append(i)
    for tid, idx in waits.items():
        a = np.array([samples.off[i][1] for i in idx], dtype=np.int64)
        b = np.array([samples.off[i][2] for i in idx], dtype=np.int64)
        t_ns = _overlap(a, b, sets.tail.get(tid, empty))
        r_ns = _overlap(a, b, sets.rest.get(tid, empty))
        for i, x, y in zip(idx, t_ns, r_ns, strict=True):
            if x or y:
                _, _, _, nr, k, u = samples.off[i]
                v = acc[("off", nr, k, u)]
                v[0] += float(x)
                v[1] += float(y)
    tot_t = sum(v[0] for v in acc.values())
    tot_r = sum(v[1] for v in acc.values())
    serving_t = sum(float((s[:, 1] - s[:, 0]).sum()) for s in sets.tail.values())
    serving_r = sum(float((s[:, 1] - s[:, 0]).sum()) for s in sets.rest.values())

    # the table: by state, syscall and user path (the kernel's wait site named alongside)
    rows: dict[tuple, dict[str, Any]] = {}
    for (state, nr, k, u), (t_ns, r_ns) in acc.items():
        key, where = row_key(u)
        row = rows.setdefault((state, nr, key), {
            "state": "on CPU" if state == "on" else "off CPU",
            "syscall": None if nr is None else _syscall_label(nr),
            "part": "on_cpu" if nr is None else syscall_class(nr), "from": where,
            "tail_ns": 0.0, "rest_ns": 0.0, "best": -1.0})
        row["tail_ns"] += t_ns
        row["rest_ns"] += r_ns
        if t_ns + r_ns > row["best"]:  # the heaviest stack of the row stands for it
            row.update(best=t_ns + r_ns, user=[f.label() for f in u],
                       module=u[0].module if u else None, kernel=[f.label() for f in k],
                       site=wait_site(k) if state == "off" else None)
    ranked = []
    for row in rows.values():
        ts = row["tail_ns"] / tot_t if tot_t else 0.0
        rs = row["rest_ns"] / tot_r if tot_r else 0.0
        ranked.append({**{k: v for k, v in row.items() if not k.endswith("_ns") and k != "best"},
                       "tail_ms": round(row["tail_ns"] / 1e6, 3),
                       "rest_ms": round(row["rest_ns"] / 1e6, 3),
                       "tail_share": round(ts, 4), "rest_share": round(rs, 4),
                       "excess": round(ts - rs, 4)})
    ranked.sort(key=lambda r: (-r["excess"], -r["tail_ms"]))
    over = [r for r in ranked if r["excess"] > 0 and r["tail_ms"] > 0]
    folded = []
    for (state, nr, k, u), (t_ns, r_ns) in acc.items():
        head = "on CPU" if state == "on" else f"off CPU: {_syscall_label(nr)}"
        frames = [head, *(f.label() for f in reversed(u)), *(f"[k] {f.label()}"
                                                              for f in reversed(k))]
        folded.append({"frames": frames, "tail_ms": round(t_ns / 1e6, 4),
                       "rest_ms": round(r_ns / 1e6, 4)})
    folded.sort(key=lambda f: -(f["tail_ms"] + f["rest_ms"]))
    out: dict[str, Any] = {
        "hz": samples.hz,
        "samples": len(samples.on), "waits": len(samples.off),
        "dropped": {"samples": max(0, samples.taken_on - len(samples.on)),
                    "waits": max(0, samples.taken_off - len(samples.off))},
        "malformed": samples.malformed,
        "named_by_tailgate": samples.named_by_tailgate,
        "split": split_summary(sets),
        "tail": {"serving_ms": round(serving_t / 1e6, 3), "profiled_ms": round(tot_t / 1e6, 3)},
        "rest": {"serving_ms": round(serving_r / 1e6, 3), "profiled_ms": round(tot_r / 1e6, 3)},
        "ranked": over[:MAX_RANKED],
        "under": [r for r in reversed(ranked) if r["excess"] < 0][:5],
        "folded": folded[:MAX_FOLDED],
        "folded_total": len(folded),
        "notes": notes(samples),
    }
    out["sentence"] = sentence(out, int(sets.slow.sum()))
    return out


def split_summary(sets: Sets) -> dict[str, Any]:
    m = sets.mode[sets.slow]
    n1, n2, n0 = int((m == 1).sum()), int((m == 2).sum()), int((m == 0).sum())
    how = ("per thread" if n1 and not n2 else "service-wide" if n2 and not n1 else
           "per thread and service-wide" if n1 and n2 else "none")
    return {"how": how, "slow_requests": int(sets.slow.sum()), "per_thread": n1,
            "service_wide": n2, "unserved": n0,
            "method": "per thread: one thread of the service was busy in the slow request's "
                      "window, its serving time there is the request's (exact); service-wide: "
                      "several were (which one served it is not recorded), the serving time "
                      "of each is counted; unserved: none was busy, nothing is counted"}


def sentence(prof: dict[str, Any], slow: int) -> str:
    if not prof["ranked"]:
        return (f"in the {slow} requests above the P99 nothing of the service's profiled time "
                "is over-represented" if prof["tail"]["profiled_ms"] else
                f"nothing of the service was profiled in the {slow} requests above the P99")
    r = prof["ranked"][0]
    what = (f"on CPU in {r['from']}" if r["state"] == "on CPU" else
            f"off CPU in {r['syscall']}" + (f" ({r['site']})" if r["site"] else "")
            + f" from {r['from']}")
    return (f"in the slowest 1 % ({slow} requests above the P99, "
            f"{prof['split']['how']}): {100 * r['tail_share']:.0f} % of the service's "
            f"profiled time {what}, against {100 * r['rest_share']:.0f} % otherwise")


def notes(samples: Samples) -> list[str]:
    """What the user stacks could not show and what to do about it: unnamed frames (no
    symbols), walks that stop short of the thread's start (no frame pointers), interpreters."""
    stacks = [u for _, _, _, u in samples.on] + [u for *_, u in samples.off]
    out: list[str] = []
    if not stacks:
        return out
    frames = [f for u in stacks for f in u]
    unknown: dict[str, int] = defaultdict(int)
    per_mod: dict[str, int] = defaultdict(int)
    for u in stacks:  # a thread's first frame unnamed in libc is no loss (see _root)
        for f in (u[:-1] if u and _root(u[-1]) else u):
            per_mod[f.module] += 1
            if not f.named:
                unknown[f.module] += 1
    for mod, n in sorted(unknown.items(), key=lambda kv: -kv[1]):
        # a file, or memory of no file ("[unknown]": JIT code); never [heap] or [stack] (a
        # walk gone astray, said below) or the vDSO (the kernel's, no file to read)
        if mod.startswith("[") and mod != "[unknown]":
            continue
        if n >= 0.2 * per_mod[mod]:
            out.append(f"{100 * n / per_mod[mod]:.0f} % of the frames in {mod} have no symbol: "
                       "install its debug symbols (Debian: its -dbgsym package) or build it "
                       "with -g and without stripping; a JIT runtime can write a perf map "
                       "(/tmp/perf-PID.map)")
    short: dict[str, int] = defaultdict(int)
    for u in stacks:
        # complete: it reaches a thread's first frame (named, or unnamed in libc: glibc's
        # start_thread is a local symbol, absent from a stripped libc)
        if u and not _root(u[-1]):
            short[u[-1].module] += 1
    n_short = sum(short.values())
    if n_short >= 0.2 * len(stacks):
        mods = ", ".join(m for m, _ in sorted(short.items(), key=lambda kv: -kv[1])[:3])
        out.append(f"{100 * n_short / len(stacks):.0f} % of the user stacks stop before the "
                   f"thread's first frame (last frame in {mods}): that code likely lacks frame "
                   "pointers, so the walk ends early or goes astray; rebuild it with "
                   "-fno-omit-frame-pointer (the callers shown above such a frame may be "
                   "wrong)")
    langs = sorted({INTERPRETERS[f.name] for f in frames if f.name in INTERPRETERS}
                   | {lang for f in frames if (lang := interpreter(f.module))})
    for lang in langs:
        out.append(f"a {lang} service: the user frames are its interpreter's (e.g. "
                   "_PyEval_EvalFrameDefault), not the functions of the program it runs"
                   + ("; Python 3.12 and later can name them with -X perf (a perf map that "
                      "bpftrace's symboliser reads; not tried here, whose Python is 3.11)"
                      if lang == "Python" else ""))
    return out
