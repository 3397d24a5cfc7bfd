"""A hostile host root, and a runner that breaks each of its files each way and judges it.

The root is built from the project's own fixture roots (``vm-l2`` for the kernel
files, ``l1l3-clean`` for NIC, PCIe and clock captures) plus a service process,
its cgroup, slabinfo and ``ss`` output, so every source tailgate reads off a host
root is there. :func:`run_kind` then takes every regular file under it, one at a
time, mutates it one way, runs the real pipeline in this process (collect with a
``Host`` on the root, judge, every renderer) and reports what went wrong:

* an exception anywhere, or a check that crashed ("internal error");
* a fact that changed without becoming missing, or missing without naming the file
  (or the command whose captured output it is);
* a finding that changed into anything but ``unknown`` naming that source, or that
  vanished without an ``unknown`` in its place;
* the canary value of a file outside the root showing up anywhere;
* control characters reaching the terminal, HTML or JUnit output, or JUnit that an
  XML parser rejects.

Run as a script (``python hostile.py KIND WORKDIR``) it prints one JSON object with
the violations, the per-run seconds and the process's peak RSS, so the test can
bound memory and time from outside.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOTS = HERE.parent / "fixtures" / "roots"
FIXTURES = HERE.parent / "fixtures" / "host"
CANARY = "987654321"
CONTROL = "\x1b[2J\x1b]0;owned\x07\x9b"
PID = 4242
KINDS = ("fifo", "devzero", "oversized", "outside-abs", "outside-rel", "empty", "binary",
         "nonfinite", "negative", "control", "superscript")
# Kinds that rewrite the numbers of a file: text fields holding digits (a driver's version
# string) change too, so only the judgment is compared.
NUMBER_KINDS = ("nonfinite", "negative", "superscript")
# Files of the fixture roots that no collector reads (kept to show the check is not vacuous).
NOT_READ = {"README"}
# Where empty output is a real answer, not a broken source: `journalctl -q` prints nothing
# when ptp4l/phc2sys logged nothing in the window (pmc's answer then stands alone).
EMPTY_IS_AN_ANSWER = {"commands/journalctl_-q_--no-pager_-o_short_--since_-5min_-t_ptp4l_-t_"
                      "phc2sys"}


def build_root(dst: Path) -> Path:
    """The merged fixture root plus a service process (pid 4242) in cgroup /svc."""
    from tailgate.host import command_file_name

    shutil.copytree(ROOTS / "vm-l2", dst, symlinks=True)
    shutil.copytree(ROOTS / "l1l3-clean", dst, symlinks=True, dirs_exist_ok=True)

    def w(rel: str, text: str) -> None:
        p = dst / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    w(f"proc/{PID}/status", "Name:\tsvc\nState:\tS (sleeping)\nThreads:\t4\n"
      "Cpus_allowed_list:\t0-1\nMems_allowed_list:\t0\nVmRSS:\t    1952 kB\n")
    w(f"proc/{PID}/schedstat", (FIXTURES / "vm-proc-pid-schedstat.txt").read_text())
    # This test process's own stat line, as the service's (the kernel's real format).
    w(f"proc/{PID}/stat", Path("/proc/self/stat").read_text())
    w(f"proc/{PID}/cgroup", "0::/svc\n")
    (dst / f"proc/{PID}/fd").mkdir(parents=True, exist_ok=True)
    w("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec 0 0\n")
    w("sys/fs/cgroup/svc/cgroup.procs", f"{PID}\n")
    w("sys/fs/cgroup/svc/cpu.stat", (FIXTURES / "cgroupv2-cpu.stat").read_text())
    w("sys/fs/cgroup/svc/cpu.max", "50000 100000\n")
    w("proc/slabinfo", "slabinfo - version: 2.1\n"
      "# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab>\n"
      "TCP                   26     26   2368   13    8 : tunables 0 0 0 : slabdata 2 2 0\n"
      "sock_inode_cache     390    390    832   39    8 : tunables 0 0 0 : slabdata 10 10 0\n"
      "filp                1344   1344    192   42    2 : tunables 0 0 0 : slabdata 32 32 0\n")
    # This machine's own /proc/net/dev: the kernel's real format (no capture in the corpus).
    w("proc/net/dev", Path("/proc/net/dev").read_text())
    ss = (FIXTURES / "vm-ss-tmi-rcvbuf.txt").read_text()
    ss = re.sub(r"(?m)^(ESTAB .*?)\s*$", rf'\1 users:(("svc",pid={PID},fd=5))', ss)
    w("commands/ss_-tmpin_state_established", ss)
    w("commands/chronyc_tracking", (FIXTURES / "chronyc-tracking.txt").read_text())
    w("commands/" + command_file_name(["journalctl", "-q", "--no-pager", "-o", "short", "--since=-5min",
                         "-t", "ptp4l", "-t", "phc2sys"]),
      (FIXTURES / "phc2sys-ptp4l-journal.txt").read_text())
    # An io_uring ring of the service: fd 3 is its anon inode, fdinfo its SQPOLL setup.
    w(f"proc/{PID}/fdinfo/3", (FIXTURES / "vm-io_uring-fdinfo-sqpoll.txt").read_text())
    os.symlink("anon_inode:[io_uring]", dst / f"proc/{PID}/fd/3")
    return dst


def regular_files(root: Path) -> list[str]:
    out = []
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = Path(d) / f
            if p.is_file() and not p.is_symlink() and f not in NOT_READ:
                out.append(str(p.relative_to(root)))
    return sorted(out)


def mutate(root: Path, rel: str, kind: str, outside: Path) -> None:
    from tailgate.host import MAX_OUTPUT_BYTES, MAX_READ_BYTES

    p = root / rel
    text = p.read_text(errors="replace")
    if kind == "control":
        lines = text.rstrip("\n").split("\n")
        lines[-1] += CONTROL
        p.write_text("\n".join(lines) + "\n")
        return
    if kind in ("fifo", "devzero", "oversized", "outside-abs", "outside-rel"):
        p.unlink()
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "devzero":
        os.symlink("/dev/zero", p)
    elif kind == "oversized":  # sparse: costs no disk, and must cost no memory either
        cap = MAX_OUTPUT_BYTES if rel.startswith("commands/") else MAX_READ_BYTES
        with open(p, "wb") as fh:
            fh.truncate(cap + 1)
    elif kind in ("outside-abs", "outside-rel"):
        # A plausible copy of the file, outside the root, carrying the canary value.
        target = outside / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        canary = re.sub(r"[0-9]+", CANARY, text, count=1) if re.search(r"[0-9]", text) \
            else text.rstrip("\n") + CANARY + "\n"
        target.write_text(canary)
        os.symlink(target if kind == "outside-abs" else os.path.relpath(target, p.parent), p)
    elif kind == "empty":
        p.write_text("")
    elif kind == "binary":
        p.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    elif kind == "nonfinite":
        names = iter(("nan", "inf", "-inf", "NaN", "Infinity") * 100000)
        p.write_text(re.sub(r"(?<![\w.])[0-9]+(\.[0-9]+)?(?![\w.])", lambda m: next(names), text))
    elif kind == "superscript":  # str.isdigit() takes '²', int() does not: no number
        p.write_text(re.sub(r"(?<![\w.:-])[0-9]([0-9]*(\.[0-9]+)?)(?![\w.:])",
                            lambda m: "\u00b2" + m.group(1), text))
    elif kind == "negative":
        p.write_text(re.sub(r"(?<![\w.:-])([0-9]+(\.[0-9]+)?)(?![\w.:])",
                            lambda m: "-" + (m.group(1) if m.group(1).strip("0.") else "1"), text))
    else:
        raise ValueError(kind)


def restore(root: Path, rel: str, saved: bytes) -> None:
    p = root / rel
    if p.is_symlink() or p.exists():
        p.unlink()
    p.write_bytes(saved)


def names_source(reason: str, rel: str) -> bool:
    """Whether a reason names the file ``rel`` (its last two components, as it may be read
    through a symlinked directory) or, for a captured output, the command."""
    from tailgate.host import command_file_name

    parts = rel.split("/")
    if "/".join(parts[-2:]) in reason:
        return True
    if len(parts) >= 2 and re.search(rf"{re.escape(parts[-2])}\b.*\b{re.escape(parts[-1])}\b",
                                     reason):
        return True  # "<device>: <attribute> unreadable"
    if rel.startswith("commands/"):
        name = rel.split("/", 1)[1]
        return any(command_file_name(seg.split(" ")) == name
                   for seg in re.findall(r"`([^`]+)`", reason))
    return False


def pipeline(root: Path):
    """collect -> judge -> verdict -> every renderer, in this process."""
    from rich.console import Console

    from tailgate.baseline import default_baseline
    from tailgate.collect import Scope, collect
    from tailgate.host import Host
    from tailgate.judge import judge
    from tailgate.report.html import render_html
    from tailgate.report.json_report import render_json
    from tailgate.report.junit import render_junit
    from tailgate.report.terminal import print_report
    from tailgate.safe import strict_json
    from tailgate.verdict import build_report

    scope = Scope(pids=(PID,), cgroup="/sys/fs/cgroup/svc")
    snap = collect(Host(root, timeout_s=2.0), scope, 0)
    report = build_report(snap, judge(snap, default_baseline()))
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=100, force_terminal=False, highlight=False))
    out = {"snapshot": strict_json(snap.to_json()), "json": render_json(report),
           "junit": render_junit(report), "html": render_html(report), "terminal": buf.getvalue()}
    return snap, report, out


def _findings(report) -> dict[str, set[tuple[str, str, str]]]:
    out: dict[str, set[tuple[str, str, str]]] = {}
    for f in report.findings:
        out.setdefault(f.id, set()).add((f.subject, f.status, f.reason))
    return out


def violations(rel: str, kind: str, clean, snap, report, out) -> list[str]:
    bad = []
    for name in ("json", "snapshot"):  # strict JSON: no NaN/Infinity literal
        try:
            json.loads(out[name], parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except ValueError as exc:
            bad.append(f"{name} output is not strict JSON: {str(exc)[:80]}")
    try:
        ET.fromstring(out["junit"].split("\n", 1)[1])
    except ET.ParseError as exc:
        bad.append(f"JUnit is not valid XML: {exc}")
    from plotly.offline import get_plotlyjs

    # The page inlines the plotly library, whose own source holds raw control bytes (a PNG
    # signature, "8BPS\x01"): that exact text is tailgate's, never the host's, so it is left
    # out of the check; every byte around it is checked.
    shown = {**out, "html": out["html"].replace(get_plotlyjs(), "")}
    for name in ("terminal", "junit", "html"):
        if re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown[name]):
            bad.append(f"raw control characters in the {name} output")
    if any(CANARY in out[name] for name in out):
        bad.append("the canary from outside the root was read")
    for f in report.findings:
        if f.status not in ("pass", "warn", "fail", "skip", "unknown"):  # e.g. "error"
            bad.append(f"{f.id}: status {f.status}: {f.reason[:160]}")
        if "internal error" in f.reason:
            bad.append(f"{f.id}: a check crashed: {f.reason[:160]}")
    if kind == "control":  # a string with control characters is still a value: shown escaped
        return bad
    if kind == "empty" and rel in EMPTY_IS_AN_ANSWER:
        if snap.fact("ptp.log").value != {"samples": [], "summaries": []}:
            bad.append(f"empty {rel} is not read as 'no log lines'")
        return bad
    clean_snap, clean_report = clean
    # Numbers replaced by garbage may leave text fields holding other text (a driver's
    # version string): those facts still change. What must hold is the judgment, below.
    for part in () if kind in NUMBER_KINDS else ("facts", "before"):
        now, was = getattr(snap, part), getattr(clean_snap, part)
        for name in sorted(set(now) | set(was)):
            a, b = now.get(name), was.get(name)
            if a == b:
                continue
            if a is None:
                bad.append(f"{part}[{name}] vanished")
            elif a.ok:
                # A fact may keep what it could read and list what it could not (pci.aer's
                # "errors"); then that list must name the source.
                if not names_source(json.dumps(a.value), rel):
                    bad.append(f"{part}[{name}] changed without going missing or naming "
                               f"{rel}: {str(a.value)[:120]}")
            elif not names_source(a.missing, rel):
                bad.append(f"{part}[{name}] missing without naming {rel}: {a.missing[:160]}")
    got, had = _findings(report), _findings(clean_report)
    for cid in sorted(got):
        new = got[cid] - had.get(cid, set())
        if not new and got[cid] == had.get(cid, set()):
            continue
        wrong = [t for t in new if t[1] != "unknown"]
        if wrong:
            bad.append(f"{cid}: became {wrong[0][1]} ({wrong[0][0]}): {wrong[0][2][:160]}")
        elif not any(names_source(t[2], rel) for t in new):
            bad.append(f"{cid}: changed without an unknown naming {rel}: "
                       f"{[t[2][:120] for t in new] or 'finding vanished'}")
    return bad


def run_kind(kind: str, work: Path) -> dict:
    root = build_root(work / "root")
    outside = work / "outside"
    clean_snap, clean_report, _ = pipeline(root)
    results, seconds, affected = {}, {}, []
    for rel in regular_files(root):
        saved = (root / rel).read_bytes()
        mutate(root, rel, kind, outside)
        t0 = time.monotonic()
        try:
            snap, report, out = pipeline(root)
            bad = violations(rel, kind, (clean_snap, clean_report), snap, report, out)
            if snap.facts != clean_snap.facts or snap.before != clean_snap.before:
                affected.append(rel)
        except Exception as exc:  # noqa: BLE001 - the point: report it, with the file
            bad = [f"crashed: {type(exc).__name__}: {str(exc)[:200]}"]
        seconds[rel] = round(time.monotonic() - t0, 4)
        restore(root, rel, saved)
        if bad:
            results[rel] = bad
    return {"kind": kind, "files": len(seconds), "affected": affected, "violations": results,
            "max_seconds": max(seconds.values()), "total_seconds": round(sum(seconds.values()), 3),
            "peak_rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM: its address space only; ru_maxrss would also carry
    the peak of the process it was forked from, a pytest that may be hundreds of MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM in /proc/self/status")


if __name__ == "__main__":
    print(json.dumps(run_kind(sys.argv[1], Path(sys.argv[2]))))
