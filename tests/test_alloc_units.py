"""Allocator detection and the generated malloc program, without a kernel: /proc/PID/maps
parsing, the symbol tables of the real allocator libraries Debian installs (CI has them:
see the Makefile), the program template's refusals, and l3.alloc.hot_path's judgments on a
real captured output of the generated program (fixtures/probes/malloc-allocators.jsonl:
pid 101 jemalloc allocating, 102 Go allocating, 103 jemalloc preallocated; the names of its
return addresses, taken from the live processes then, in malloc-allocators.names.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tailgate.judge import checks, run_check
from tailgate.model import Fact, ParseError, Snapshot, SourceError
from tailgate.probes import allocators as al
from tailgate.probes import analyze, malloc_program
from tailgate.probes.output import parse_output

FIX = Path(__file__).parent / "fixtures" / "probes"
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")


def test_parse_maps_keeps_files_and_skips_anonymous_memory():
    text = (
        "55d0c8a00000-55d0c8a01000 r--p 00000000 fe:00 2147007                    /srv/svc\n"
        "55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:00 2147007                    /srv/svc\n"
        "7f38c1b3a000-7f38c1c90000 r-xp 00026000 fe:00 339380                     "
        "/usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)\n"
        "7f38c1d00000-7f38c1d02000 rw-p 00000000 00:00 0 \n"
        "7f38c1d10000-7f38c1d12000 r-xp 00000000 00:00 0                          [vdso]\n"
        "7ffd1000-7ffd2000 r-xp 00000000 00:1c 12                       /tmp/a file with spaces\n")
    maps = al.parse_maps(text)
    assert len(maps) == 6 and maps[3].path == "" and maps[1].executable
    objs = al.mapped_objects(maps)
    assert [m.path for m in objs] == ["/srv/svc", "/usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)",
                                      "/tmp/a file with spaces"]
    # The handle given to bpftrace is built from integers only, never from the path.
    assert objs[2].map_file(42) == "/proc/42/map_files/7ffd1000-7ffd2000"
    with pytest.raises(ParseError, match="line 1"):
        al.parse_maps("not a maps line\n")


def test_parse_maps_of_this_process():
    maps = al.parse_maps(Path(f"/proc/{os.getpid()}/maps").read_text())
    assert any(m.executable and "python" in m.path for m in maps)


@pytest.mark.parametrize("path, family", [
    (LIBDIR / "libc.so.6", "glibc"),
    (LIBDIR / "libjemalloc.so.2", "jemalloc"),
    (LIBDIR / "libtcmalloc.so.4", "tcmalloc"),
    (LIBDIR / "libmimalloc.so.2", "mimalloc"),
    (Path("/usr/lib/x86_64-linux-musl/libc.so"), "musl"),
    (LIBDIR / "libstdc++.so.6", None),  # its operator new calls malloc: no allocator
    (LIBDIR / "ld-linux-x86-64.so.2", None),
])
def test_classify_the_real_libraries(path, family):
    obj = al.read_symbols(str(path))
    assert al.classify(obj) == family
    if family:
        entries = al.entry_points(family, obj)
        assert entries[0] == "malloc" and {"calloc", "realloc"} <= set(entries)
        # one name per address: no call can be counted twice through an alias
        addrs = [obj.defined[e] for e in entries]
        assert len(addrs) == len(set(addrs))


def test_allocators_that_replace_operator_new_have_it_probed():
    for lib in ("libjemalloc.so.2", "libtcmalloc.so.4", "libmimalloc.so.2"):
        obj = al.read_symbols(str(LIBDIR / lib))
        entries = al.entry_points(al.classify(obj), obj)
        assert "_Znwm" in entries or "mi_new" in entries, lib
    glibc = al.read_symbols(str(LIBDIR / "libc.so.6"))
    assert not set(al.NEW) & set(al.entry_points("glibc", glibc))


def test_aliases_are_probed_once():
    obj = al.ObjectSymbols({"malloc": 0x100, "tc_malloc": 0x100, "calloc": 0x200,
                            "_Znwm": 0x300, "_Znam": 0x300}, frozenset(), True)
    assert al.classify(obj) == "tcmalloc"
    assert al.entry_points("tcmalloc", obj) == ("malloc", "calloc", "_Znwm")


def test_a_rust_binary_with_jemalloc_linked_in_is_jemalloc():
    # tikv-jemallocator's prefixed symbols, in the executable's own .symtab
    obj = al.ObjectSymbols({"_rjem_mallocx": 0x10, "_rjem_rallocx": 0x20, "_rjem_malloc": 0x30,
                            "_rjem_calloc": 0x40}, frozenset(), True)
    assert al.classify(obj) == "jemalloc"
    entries = al.entry_points("jemalloc", obj)
    assert set(entries) == {"_rjem_mallocx", "_rjem_rallocx", "_rjem_malloc", "_rjem_calloc"}
    assert al.SIZE_ARG["_rjem_calloc"] == "arg0 * arg1" and al.SIZE_ARG["je_rallocx"] == "arg1"
    text = malloc_program.render([al.Allocator("jemalloc", "/srv/svc", "/proc/9/map_files/1-2",
                                               (1, 1), entries)])
    assert 'sum(arg0 * arg1)' in text and '"jemalloc:_rjem_calloc"' in text


def _region(path="/srv/svc"):
    return al.Region(0x400000, 0x480000, "r-xp", 7, path)


def test_a_stripped_go_binary_cannot_be_probed_and_says_why():
    obj = al.ObjectSymbols({}, frozenset({".text", ".go.buildinfo"}), False)
    alloc, problem = al.judge_object(_region(), 9, obj, (1, 7))
    assert alloc is None and "go allocator in svc" in problem
    assert "runtime.mallocgc" in problem and "stripped" in problem


def test_an_unknown_allocator_is_probed_but_reported():
    obj = al.ObjectSymbols({"malloc": 0x10, "free": 0x20}, frozenset(), True)
    alloc, problem = al.judge_object(_region("/opt/lib/libsnmalloc.so"), 9, obj, (1, 7))
    assert alloc.family == al.UNRECOGNISED and alloc.entries == ("malloc",)
    assert "libsnmalloc.so defines malloc" in problem


@pytest.mark.integration
def test_the_python_running_these_tests_is_a_runtime_that_cannot_be_probed():
    # pymalloc serves small objects without malloc: zero calls must not pass.
    found = al.detect(os.getpid())
    assert any(p.startswith("cpython runtime in ") and "pymalloc" in p for p in found.problems)
    assert "glibc" in {a.family for a in found.allocators}


def test_an_object_that_is_no_allocator_is_ignored():
    obj = al.ObjectSymbols({}, frozenset({".text"}), True)
    assert al.judge_object(_region(), 9, obj, (1, 7)) == (None, None)


def test_read_symbols_of_a_non_elf_file_is_a_parse_error(tmp_path):
    bad = tmp_path / "x.so"
    bad.write_bytes(b"#!/bin/sh\necho not elf\n")
    with pytest.raises(ParseError, match="ELF"):
        al.read_symbols(str(bad))
    with pytest.raises(SourceError):
        al.read_symbols(str(tmp_path / "absent.so"))


def test_detect_an_absent_process_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="maps"):
        al.detect(12345, proc=str(tmp_path))


# -- the generated program ---------------------------------------------------------------------

def _alloc(file="/proc/42/map_files/7f00-7f80", family="jemalloc", entries=("malloc",),
           ident=(1, 2)):
    return al.Allocator(family, "/anything/the process says", file, ident, entries)


def test_render_writes_only_checked_text():
    text = malloc_program.render([
        _alloc(entries=("malloc", "mallocx", "_Znwm")),
        _alloc(file="/proc/43/map_files/7f00-7f80", ident=(1, 2)),  # same file: once
        _alloc(file="/proc/42/map_files/400000-480000", family="go",
               entries=("runtime.mallocgc",), ident=(1, 3))])
    assert text.startswith("/*\n * malloc.bt - ") and "interval:ms:$1" in text
    assert text.count("uprobe:") == 4 and "/proc/43/" not in text
    assert "uprobe:/proc/42/map_files/7f00-7f80:mallocx" in text
    assert '@calls[pid, "go:runtime.mallocgc"]' in text and 'sum(reg("ax"))' in text
    assert "/anything" not in text


@pytest.mark.parametrize("bad", [
    _alloc(file="/usr/lib/libc.so.6"),
    _alloc(file="/proc/42/map_files/7f00-7f80:malloc { system(\"x\") } //"),
    _alloc(file="/proc/42/map_files/7f00-7f80\n"),
    _alloc(family="evil\"; system(\"x"),
    _alloc(entries=("system",)),
])
def test_render_refuses_anything_else(bad):
    with pytest.raises(ValueError):
        malloc_program.render([bad])


def test_a_probe_that_did_not_attach_is_a_shortfall():
    text = malloc_program.render([_alloc(entries=("malloc", "calloc"))])
    assert malloc_program.attach_shortfall(text, 3) is None
    assert "attached 2 of the program's 3" in malloc_program.attach_shortfall(text, 2)
    assert malloc_program.attach_shortfall(text, None)


def test_prepare_reports_processes_it_cannot_read():
    def detect(pid):
        raise SourceError(f"/proc/{pid}/maps: No such file or directory")

    text, found = malloc_program.prepare([7], detect)
    assert text is None and "cannot tell its allocator" in found[7].problems[0]


# -- the check on a real output of the generated program -------------------------------------

JE = {"family": "jemalloc", "object": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
      "entries": ["malloc", "calloc", "realloc"]}
GLIBC = {"family": "glibc", "object": "/usr/lib/x86_64-linux-gnu/libc.so.6",
         "entries": ["malloc", "calloc", "realloc"]}
GO = {"family": "go", "object": "/srv/alloc_go", "entries": ["runtime.mallocgc"]}


def _judge(found: dict, pids=(101, 102, 103)) -> dict[str, object]:
    out = parse_output((FIX / "malloc-allocators.jsonl").read_text(encoding="utf-8"))
    names = json.loads((FIX / "malloc-allocators.names.json").read_text(encoding="utf-8"))
    s = analyze.malloc(out, pids=pids, duration_s=1.0, allocators=found, names=names)
    snap = Snapshot(host={}, target={"pids": list(pids)}, interval_s=1.0, taken_at=0.0,
                    facts={"probe.malloc": Fact(value=s)})
    return {f.subject: f for f in run_check("l3.alloc.hot_path", checks()["l3.alloc.hot_path"],
                                            snap, {"limit": 0.0})}


def test_each_allocator_is_counted_and_named():
    found = _judge({"101": {"allocators": [GLIBC, JE], "unprobed": []},
                    "102": {"allocators": [GO], "unprobed": []},
                    "103": {"allocators": [GLIBC, JE], "unprobed": []}})
    je, go, quiet = found["pid 101"], found["pid 102"], found["pid 103"]
    assert je.status == "fail" and "through jemalloc" in je.reason
    assert "handle_request_alloc" in je.reason and je.evidence["by_allocator"] == {
        "jemalloc": je.evidence["calls"]}
    assert go.status == "fail" and "through go" in go.reason
    assert go.evidence["top_stacks"][0]["frames"][:2] == ["runtime.makeslice+82",
                                                          "main.handleRequestAlloc+69"] or \
        go.evidence["top_stacks"][0]["frames"][:2] == ["runtime.growslice+1196",
                                                       "main.handleRequestAlloc+135"]
    # not runtime.makeslice, its immediate caller: the Go function that allocates
    assert "called most from main.handleRequestAlloc" in go.reason
    assert go.evidence["functions"] == {"runtime.mallocgc": go.evidence["calls"]}
    assert quiet.status == "pass" and "jemalloc (libjemalloc.so.2)" in quiet.reason


def test_zero_calls_with_an_unprobed_allocator_is_unknown_and_a_fail_stays_a_fail():
    why = "go allocator in svc: cannot probe runtime.mallocgc: its symbol table is stripped"
    found = _judge({"101": {"allocators": [GLIBC], "unprobed": [why]},
                    "103": {"allocators": [GLIBC], "unprobed": [why]}}, pids=(101, 103))
    assert found["pid 101"].status == "fail"
    assert found["pid 103"].status == "unknown" and why in found["pid 103"].reason


def test_nothing_probed_is_unknown():
    found = _judge({"103": {"allocators": [], "unprobed": []}}, pids=(103,))
    assert found["pid 103"].status == "unknown"


def _result(text: str, output):
    from tailgate.probes.driver import Result, Run

    return Result(run=Run("malloc", 1.0, 0, (101,), text=text), output=output, sampled_s=1.0,
                  startup_s=0.1, stopped=None)


def test_an_output_cut_before_its_end_line_is_an_error_not_zero_calls():
    from tailgate.probes import Request, _summary

    text = malloc_program.render([_alloc()])
    lines = (FIX / "malloc-allocators.jsonl").read_text(encoding="utf-8").splitlines()
    whole = parse_output("\n".join(lines))
    assert malloc_program.complete(whole.printf)
    req = Request("malloc", 1.0, (101,))
    ctx = {"allocators": {"101": {"allocators": [JE], "unprobed": []}}}
    # the fixture's program had 27 probes: this one's 2 all attached. Its pids are gone:
    # the addresses stay numbers.
    s = _summary(req, _result(text, whole), ctx)
    row = s["processes"]["101"]
    assert row["calls"] > 0 and row["unprobed"] == []
    assert all(c.startswith("0x") for c in row["callers"])
    # What bpftrace 0.17 was seen to print: @bytes, then nothing more.
    cut = parse_output("\n".join(ln for ln in lines if "@bytes" in ln or "attached" in ln))
    with pytest.raises(SourceError, match="ended before printing all its maps"):
        _summary(req, _result(text, cut), ctx)
    # Fewer probes attached than written: counted, but reported as unprobed.
    few = parse_output(lines[0].replace('"probes": 27', '"probes": 1') + "\n"
                       + "\n".join(lines[1:]))
    s = _summary(req, _result(text, few), ctx)
    assert "attached 1 of the program's 2 probes" in s["processes"]["101"]["unprobed"][0]


@pytest.mark.parametrize("cut", [0, 4, 64, 1000, 20000, 100000, -1000])
def test_a_truncated_elf_file_is_a_source_error_never_a_crash(tmp_path, cut):
    data = (LIBDIR / "libjemalloc.so.2").read_bytes()
    bad = tmp_path / "cut.so"
    bad.write_bytes(data[:cut])
    with pytest.raises(SourceError):
        al.read_symbols(str(bad))


def test_symbolizer_names_this_process_and_refuses_other_addresses():
    import ctypes

    from tailgate.probes.symbols import Symbolizer, name_addresses

    libc = ctypes.CDLL("libc.so.6")
    addr = ctypes.cast(libc.malloc, ctypes.c_void_p).value
    sym = Symbolizer(os.getpid())
    assert sym(addr) == ("malloc", 0)
    assert sym(addr + 3) == ("malloc", 3)
    assert sym(8) is None  # not mapped
    assert name_addresses(os.getpid(), {addr}) == {addr: "malloc+0"}
    assert name_addresses(2**22 + 12345, {addr}) == {}  # no such process: nothing named


def test_cxx_names_are_demangled_like_cxxfilt():
    from tailgate.probes.symbols import demangle

    assert demangle("_ZL20handle_request_alloci") == "handle_request_alloc(int)"
    assert demangle("_Znwm") == "operator new(unsigned long)"
    for plain in ("main", "runtime.mallocgc", "_Zbogus"):
        assert demangle(plain) == plain
