"""`tailgate campaign run`: every step as the real tailgate command, one index of what ran.

Each step is ``python -m tailgate ...`` in its own process with a time-out: the same code, the
same options and the same exit statuses as by hand, isolated from the others (a step that
crashes, hangs or refuses its input is recorded with its reason and the campaign goes on).
The order is bottom-up and quiet first: inspect (with its probes) before any load, so the
probes see the host as it is; then each load; then the collective.

The index (``campaign.json``, ``tailgate_campaign: 1``)::

    {"tailgate_campaign": 1, "name", "tailgate": VERSION, "python", "campaign_file":
     {"path", "copy", "sha256"}, "started", "finished" (UTC, ISO 8601), "hosts": [...],
     "steps": [{"name", "kind": inspect|bench|diagnose|collective, "argv", "started",
                "duration_s", "exit_status", "status": ok|gate|failed, "reason",
                "members": [{"file", "sha256", "bytes"}]}]}

A step's status: ``ok`` (exit 0), ``gate`` (exit 1: the command ran and a red line or an
SLO was crossed; its document is as good as any), ``failed`` (anything else, a time-out, or
no document: ``reason`` says which, from the command's own last stderr line).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..safe import one_line
from .spec import Campaign, Load

SCHEMA = 1
INDEX = "campaign.json"
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Step:
    name: str
    kind: str  # inspect | bench | diagnose | collective
    argv: tuple[str, ...]  # after `python -m tailgate`
    files: tuple[str, ...]  # the documents it writes, relative to the campaign directory
    load: Load | None = None
    launcher: tuple[str, ...] = ()  # what runs `python -m tailgate ...` (mpirun -np 4)
    launcher_runs_module: bool = False  # the launcher takes `-m tailgate` itself (torchrun)

    def command(self) -> list[str]:
        if self.launcher_runs_module:
            return [*self.launcher, "-m", "tailgate", *self.argv]
        return [*self.launcher, sys.executable, "-m", "tailgate", *self.argv]


@dataclass
class Outcome:
    step: Step
    started: str
    duration_s: float
    exit_status: int | None
    status: str
    reason: str = ""
    members: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. inspect's overlap with a load

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "name": self.step.name, "kind": self.step.kind, "argv": list(self.step.argv),
                "started": self.started, "duration_s": round(self.duration_s, 3),
                "exit_status": self.exit_status, "status": self.status, "reason": self.reason,
                "members": self.members}


def _slug(name: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_" else "-" for c in name).strip("-")
    return (out or "load")[:60]


def _service_args(c: Campaign) -> list[str]:
    out: list[str] = []
    for pid in c.pids:
        out += ["--pid", str(pid)]
    if c.cgroup:
        out += ["--cgroup", c.cgroup]
    return out


def _bench_args(load: Load) -> list[str]:
    """A load's options as the bench's command line (the scenario keys are its long options)."""
    out = [str(load.options["url"])]
    for key, val in load.options.items():
        if key == "url":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(val, bool):
            out += [flag] if val else []
        elif isinstance(val, list):
            for v in val:
                out += [flag, str(v)]
        else:
            out += [flag, str(val)]
    return out


def plan(c: Campaign) -> list[Step]:
    """The steps of a campaign, in the order they run (diagnose steps are added on a miss)."""
    argv = ["inspect", "--interval", f"{c.interval_s:g}", "--no-history", "--quiet",
            "--json", "inspect.json"]
    if c.probe_window_s:
        argv += ["--probe-window", f"{c.probe_window_s:g}"]
    if c.baseline:
        argv += ["--baseline", c.baseline]
    if c.ray:
        argv += ["--ray", c.ray]
    else:  # one host: its snapshot too (the probes' histograms give the L2 rows their noise)
        argv += ["--save", "snapshot.json", *_service_args(c)]
        for i in c.ifaces:
            argv += ["--iface", i]
        for p in c.dpdk:
            argv += ["--dpdk", p]
        if c.memory_stats:
            argv += ["--memory-stats", c.memory_stats]
    if c.engine:
        argv += ["--engine", c.engine]
    files = ("inspect.json",) if c.ray else ("inspect.json", "snapshot.json")
    steps = [Step("inspect", "inspect", tuple(argv), files)]
    for load in c.loads:
        out = f"load-{_slug(load.name)}.json"
        argv = ["bench", *_bench_args(load), "--quiet", "--json", out]
        if c.ray:
            argv += ["--ray", c.ray]
        steps.append(Step(f"load {load.name}", "bench", tuple(argv), (out,), load))
    if c.collective is not None:
        steps.append(Step("collective", "collective",
                          ("bench", "allreduce", *c.collective, "--quiet", "--json",
                           "collective.json"), ("collective.json",),
                          launcher=c.launcher, launcher_runs_module=c.launcher_runs_module))
    return steps


def diagnose_step(c: Campaign, load: Load) -> Step:
    out = f"diagnose-{_slug(load.name)}.json"
    return Step(f"diagnose {load.name}", "diagnose",
                ("diagnose", *_bench_args(load), *_service_args(c), "--json", out),
                (out,), load)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return one_line(lines[-1], 300) if lines else ""


def _stop(proc: subprocess.Popen) -> None:
    """A hung step: its whole process group (bpftrace, workers, mpirun) is ended."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(step: Step, out_dir: str, timeout_s: float) -> Outcome:
    started, t0 = _now(), time.monotonic()
    for f in step.files:  # a document left by an earlier run in this directory is not this one's
        try:
            os.unlink(os.path.join(out_dir, f))
        except FileNotFoundError:
            pass
    stderr_path = os.path.join(out_dir, f"{step.files[0].rsplit('.', 1)[0]}.stderr")
    with open(stderr_path, "w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(step.command(), cwd=out_dir,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = None
        except BaseException:
            _stop(proc)
            raise
        err.seek(0)
        tail = err.read()[-20000:]
    duration = time.monotonic() - t0
    members = []
    for f in step.files:
        p = os.path.join(out_dir, f)
        if os.path.isfile(p) and os.path.getsize(p) > 0:
            members.append({"file": f, "sha256": digest(p), "bytes": os.path.getsize(p)})
    if os.path.getsize(stderr_path) > 0:
        members.append({"file": os.path.basename(stderr_path), "sha256": digest(stderr_path),
                        "bytes": os.path.getsize(stderr_path)})
    else:
        os.unlink(stderr_path)
    have_doc = any(m["file"] == step.files[0] for m in members)
    if code is None:
        status, reason = "failed", f"killed after the step's time-out of {timeout_s:g} s"
    elif code in (0, 1) and have_doc:
        status = "ok" if code == 0 else "gate"
        reason = "" if code == 0 else _gate_reason(step, os.path.join(out_dir, step.files[0]))
    else:
        status = "failed"
        last = _last_line(tail)
        reason = (f"exit status {code}" + (f": {last}" if last else "")
                  + ("" if have_doc or code not in (0, 1) else f" (no {step.files[0]})"))
    return Outcome(step, started, duration, code, status, reason, members)


def _gate_reason(step: Step, path: str) -> str:
    """Why a command that ran exited 1: the SLOs missed, the failing layer."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return "exit status 1"
    if step.kind == "inspect":
        v = doc.get("verdict") or {}
        return f"verdict {v.get('status')}: first failing layer {v.get('first_failing_layer')}"
    missed = [s.get("expr") for s in doc.get("slo") or [] if not s.get("pass")]
    if missed:
        return "SLO missed: " + ", ".join(str(m) for m in missed)
    if step.kind == "diagnose":
        return "a cause was claimed"
    return "exit status 1"


def _hosts(out_dir: str, outcomes: list[Outcome]) -> list[str]:
    """The hosts the documents say they were measured on (one host: this one)."""
    hosts: list[str] = []
    for o in outcomes:
        if o.step.kind != "inspect" or not o.members:
            continue
        try:
            with open(os.path.join(out_dir, o.step.files[0]), encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        name = (doc.get("host") or {}).get("hostname")
        if name:
            hosts.append(str(name))
        for h in doc.get("hosts") or []:  # a fleet view: one entry per node
            n = h.get("hostname") or h.get("host") if isinstance(h, dict) else h
            if n:
                hosts.append(str(n))
    return list(dict.fromkeys(hosts or [socket.gethostname()]))


def run_campaign(c: Campaign, out_dir: str, diagnose: bool, progress: TextIO) -> dict[str, Any]:
    """Run every step of ``c`` into ``out_dir``; the index document (also written there)."""
    from .. import __version__

    os.makedirs(out_dir, exist_ok=True)
    copy = os.path.join(out_dir, "campaign.yaml")
    shutil.copyfile(c.path, copy)
    index: dict[str, Any] = {
        "tailgate_campaign": SCHEMA, "name": c.name, "tailgate": __version__,
        "python": platform.python_version(), "kernel": platform.release(),
        "campaign_file": {"path": os.path.abspath(c.path), "copy": "campaign.yaml",
                          "sha256": digest(copy)},
        "service": {"pids": list(c.pids), "cgroup": c.cgroup}, "ray": c.ray,
        "started": _now(), "finished": None, "hosts": [], "steps": []}
    steps = plan(c)
    outcomes: list[Outcome] = []
    i = 0
    while i < len(steps):
        step = steps[i]
        cmd = " ".join(step.argv[:2] if step.kind == "collective" else step.argv[:1])
        print(f"campaign {c.name}: [{i + 1}/{len(steps)}] {step.name}: tailgate {cmd} ...",
              file=progress, flush=True)
        if step.kind == "inspect" and c.inspect_during:  # inspect while that load runs
            j = next(k for k, s in enumerate(steps) if s.load and s.load.name == c.inspect_during)
            load_step = steps.pop(j)
            print(f"campaign {c.name}: [{i + 1}/{len(steps) + 1}] {load_step.name}: tailgate "
                  "bench ... (inspect runs meanwhile)", file=progress, flush=True)
            done = _side_by_side(step, load_step, out_dir, c.timeout_s)
            steps.insert(i + 1, load_step)
        else:
            done = [run_step(step, out_dir, c.timeout_s)]
        for o in done:
            outcomes.append(o)
            k = steps.index(o.step)
            print(f"campaign {c.name}: [{k + 1}/{len(steps)}] {o.step.name}: {o.status} "
                  f"({o.duration_s:.1f} s){': ' + o.reason if o.reason else ''}",
                  file=progress, flush=True)
            if (diagnose and o.step.kind == "bench" and o.status == "gate"
                    and o.step.load is not None and "SLO missed" in o.reason):
                steps.insert(k + 1, diagnose_step(c, o.step.load))
        i += len(done)
        index["steps"] = [x.to_json() for x in outcomes]
        _write_index(out_dir, index)  # after every step: an interrupted campaign keeps its part
    index["finished"] = _now()
    index["hosts"] = _hosts(out_dir, outcomes)
    _write_index(out_dir, index)
    return index


def _side_by_side(inspect: Step, load: Step, out_dir: str, timeout_s: float) -> list[Outcome]:
    """The load, and inspect started once the load is under way (its warm-up, or 1 s), so
    the counters and probes see the service loaded."""
    from concurrent.futures import ThreadPoolExecutor

    from ..bench.units import parse_duration

    lead = 1.0
    if load.load is not None and load.load.options.get("warmup"):
        lead += parse_duration(str(load.load.options["warmup"]))
    with ThreadPoolExecutor(2) as pool:
        bench = pool.submit(run_step, load, out_dir, timeout_s)
        time.sleep(lead)
        t_insp = time.monotonic()
        insp = pool.submit(run_step, inspect, out_dir, timeout_s)
        i, b = insp.result(), bench.result()
    # how long inspect went on after the load had ended (its counters saw no load then)
    after = (t_insp + i.duration_s) - (t_insp - lead + b.duration_s)
    i.extra = {"during": load.load.name if load.load else load.name,
               "outlasted_load_s": round(max(0.0, after), 3)}
    return [i, b]


def _write_index(out_dir: str, index: dict[str, Any]) -> None:
    tmp = os.path.join(out_dir, INDEX + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, INDEX))
