"""l3.alloc.hot_path on real programs, through each allocator: the alloc workload (C, or Go)
built against glibc, musl (dynamic and static), jemalloc, tcmalloc, mimalloc and the Go
runtime, each in an allocating and a preallocating variant, run plainly and inside new PID
and mount namespaces (its binary and allocator library on a tmpfs only the namespace sees).
Judged by `tailgate inspect --probe-window` and `tailgate probe malloc`, as root with
bpftrace (CI): the allocating variant fails through its own allocator, the preallocating
one passes, an allocator that cannot be probed is unknown. Workloads end by themselves."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import workloads
from support.inspect import gate_code
from support.workloads import allocators as wl

WINDOW_S = "1"
LIFE_S = 60  # each workload ends by itself after this (killed sooner, at the end of its test)
FAMILY = {"musl-static": "musl", "go-stripped": "go"}
# Those whose allocator is on the namespace's tmpfs (a copied library or the executable
# itself); glibc and dynamic musl stay in /usr/lib.
INSIDE = {*wl.LIBRARY, "musl-static", "go"}


@pytest.fixture(scope="module", autouse=True)
def _tracefs():
    yield from workloads.tracefs_mounted()


def tailgate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def _inspect(tmp_path, pids) -> dict[str, dict]:
    args = ["inspect", "--interval", "0", "--probe-window", WINDOW_S, "--no-history",
            "--json", "-", "--quiet"]
    for pid in pids:
        args += ["--pid", str(pid)]
    res = tailgate(*args)
    report = json.loads(res.stdout)
    assert res.returncode == gate_code(report), res.stderr  # the status the report decides
    found = {f["subject"]: f for f in report["findings"]
             if f["id"] == "l3.alloc.hot_path"}
    assert {f"pid {p}" for p in pids} == set(found), json.dumps(found, indent=1)  # each judged
    return found


@pytest.mark.parametrize("allocator", ["glibc", "musl", "musl-static", "jemalloc", "tcmalloc",
                                       "mimalloc", "go"])
def test_allocating_fails_and_preallocated_passes_plainly_and_in_namespaces(tmp_path, allocator):
    family = FAMILY.get(allocator, allocator)
    ns_alloc, ns_pre = tmp_path / "a", tmp_path / "p"
    ns_alloc.mkdir()
    ns_pre.mkdir()
    specs = [(allocator, "alloc", LIFE_S), (allocator, "prealloc", LIFE_S),
             (allocator, "alloc", LIFE_S, ns_alloc), (allocator, "prealloc", LIFE_S, ns_pre)]
    with wl.running(*specs) as (alloc, pre, nalloc, npre):
        # The namespaced ones really live elsewhere: their files are not on the host.
        assert not list(ns_alloc.iterdir()) and nalloc.pid != nalloc.proc.pid
        found = _inspect(tmp_path, [alloc.pid, pre.pid, nalloc.pid, npre.pid])
    for w, where in ((alloc, None), (nalloc, ns_alloc)):
        f = found[f"pid {w.pid}"]
        assert f["status"] == "fail", json.dumps(found, indent=1)
        assert f["evidence"]["by_allocator"].get(family, 0) > 0, f
        assert f"through {family}" in f["reason"]
        handler = "main.handleRequestAlloc" if family == "go" else "handle_request_alloc"
        assert f"called most from {handler}" in f["reason"], f
        objects = {a["family"]: a["object"] for a in f["evidence"]["allocators"]}
        if where is not None and allocator in INSIDE:
            # the path as the process sees it, on the namespace's tmpfs
            assert objects[family].startswith(str(where)), objects
    for w in (pre, npre):
        f = found[f"pid {w.pid}"]
        assert f["status"] == "pass", f
        assert f["observed"] == 0 and f"{family} (" in f["reason"], f


def test_probe_malloc_cli_counts_each_allocator_in_namespaces(tmp_path):
    dirs = [tmp_path / n for n in ("go", "je", "tc")]
    for d in dirs:
        d.mkdir()
    with wl.running(("go", "alloc", LIFE_S, dirs[0]), ("jemalloc", "alloc", LIFE_S, dirs[1]),
                    ("tcmalloc", "prealloc", LIFE_S, dirs[2]),
                    ("mimalloc", "alloc", LIFE_S)) as (go, je, tc, mi):
        pids = [str(w.pid) for w in (go, je, tc, mi)]
        shown = tailgate("probe", "malloc", "--pid", pids[1], "--print-program")
        res = tailgate("probe", "malloc", "--duration", WINDOW_S, "--json", "-",
                       *(x for p in pids for x in ("--pid", p)))
    assert shown.returncode == 0, shown.stderr
    # bpftrace is given the kernel's link to the file, never the namespace's path.
    assert f"uprobe:/proc/{je.pid}/map_files/" in shown.stdout and str(dirs[1]) not in "".join(
        ln for ln in shown.stdout.splitlines() if not ln.startswith(("#", " *")))
    assert f"# pid {je.pid}: jemalloc in {dirs[1]}/libjemalloc.so" in shown.stdout
    assert res.returncode == 0, res.stderr
    procs = json.loads(res.stdout)["processes"]
    assert procs[pids[0]]["by_allocator"]["go"] > 0
    assert procs[pids[0]]["functions"].keys() == {"runtime.mallocgc"}
    assert any("handleRequestAlloc" in " ".join(s["frames"]) for s in procs[pids[0]]["top_stacks"])
    assert procs[pids[1]]["by_allocator"]["jemalloc"] > 0
    assert "handle_request_alloc" in procs[pids[1]]["callers"]
    assert procs[pids[2]]["calls"] == 0
    assert {a["family"] for a in procs[pids[2]]["allocators"]} == {"glibc", "tcmalloc"}
    assert procs[pids[3]]["by_allocator"]["mimalloc"] > 0


def test_operator_new_of_a_replacing_allocator_is_counted(tmp_path):
    # C++ allocating with new: jemalloc, tcmalloc and mimalloc replace operator new and
    # serve it without entering their malloc, so only probing it sees these allocations.
    ns = tmp_path / "ns"
    ns.mkdir()
    with wl.running(("jemalloc-cxx", "alloc", LIFE_S), ("tcmalloc-cxx", "alloc", LIFE_S, ns),
                    ("mimalloc-cxx", "alloc", LIFE_S),
                    ("tcmalloc-cxx", "prealloc", LIFE_S)) as ws:
        found = _inspect(tmp_path, [w.pid for w in ws])
    for w, family in zip(ws[:3], ("jemalloc", "tcmalloc", "mimalloc"), strict=True):
        f = found[f"pid {w.pid}"]
        assert f["status"] == "fail" and f["evidence"]["by_allocator"].get(family, 0) > 0, f
        assert set(f["evidence"]["functions"]) & {"_Znwm", "mi_new"}, f
        assert "handle_request_alloc" in f["reason"], f
    assert found[f"pid {ws[3].pid}"]["status"] == "pass"


def test_what_cannot_be_probed_is_unknown_never_a_pass(tmp_path):
    # A stripped Go binary (no runtime.mallocgc to attach to) and a Python process asleep
    # (pymalloc makes no call a uprobe could count): zero calls seen prove nothing.
    idle_py = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); "
                                f"time.sleep({LIFE_S})"], stdout=subprocess.PIPE, text=True)
    try:
        assert idle_py.stdout.readline().strip() == "ready"
        with wl.running(("go-stripped", "alloc", LIFE_S), ("go-stripped", "prealloc", LIFE_S),
                        ("glibc", "prealloc", LIFE_S)) as (alloc, pre, fine):
            probe = tailgate("probe", "malloc", "--pid", str(alloc.pid), "--duration", WINDOW_S)
            found = _inspect(tmp_path, [alloc.pid, pre.pid, fine.pid, idle_py.pid])
    finally:
        idle_py.kill()
        idle_py.wait()
        idle_py.stdout.close()
    # Nothing of it can be probed: the probe says so and exits 2.
    assert probe.returncode == 2 and "stripped" in probe.stderr, probe.stderr
    for w in (alloc, pre):  # allocating or not
        f = found[f"pid {w.pid}"]
        assert f["status"] == "unknown" and "runtime.mallocgc" in f["reason"], f
        assert "stripped" in f["reason"]
    py = found[f"pid {idle_py.pid}"]
    assert py["status"] == "unknown" and "pymalloc" in py["reason"], py
    assert found[f"pid {fine.pid}"]["status"] == "pass"
