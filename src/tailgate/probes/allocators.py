"""Which heap allocator(s) a process uses, from its mappings and the ELF symbols of what it maps.

``l3.alloc.hot_path`` counts calls to an allocator's entry points with uprobes, so it
must probe the allocator the process really calls: a service linked with jemalloc
or tcmalloc never enters glibc's ``malloc``, and a Go program allocates in
``runtime.mallocgc`` inside its own (static) executable. Zero calls to the wrong
allocator would read as a pass.

Reading: ``/proc/PID/maps`` lists the objects mapped executable; each is opened
through ``/proc/PID/map_files/START-END``, the kernel's handle on the very file the
process mapped, so a library that lives only in a container's mount namespace (or
was deleted by an upgrade) is read and probed all the same, and the path handed to
bpftrace is built from integers alone. Symbols come from ``.dynsym`` and
``.symtab`` (pyelftools).

Judging which allocator an object is (:func:`classify`) and which entry points to
probe (:func:`entry_points`) is pure, from the symbols. An object that defines
``malloc`` but matches no known allocator, an allocator whose entry points are not
in its symbol table (a stripped static binary), a runtime whose allocator makes no
call a uprobe could count (CPython's pymalloc, the JVM's TLABs) and an object that
could not be read are *problems*: with zero calls counted the finding is ``unknown`` with that
reason, never a pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..host import valid_pid
from ..model import ParseError, SourceError

# The standard C entry points. reallocarray is left out: every libc here forwards it
# to realloc, which is probed, so it would count twice.
STD = ("malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign", "valloc",
       "pvalloc")
# C++ operator new, defined by allocators that replace it (jemalloc, tcmalloc,
# mimalloc). libstdc++'s own operator new calls malloc, so it is not probed.
NEW = ("_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
       "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t",
       "_ZnamSt11align_val_tRKSt9nothrow_t")
GO_MALLOC = "runtime.mallocgc"

# Which argument is the size, per entry point: fixed bpftrace expressions, never text
# read from a process. Go's register ABI (1.17+, amd64) passes the size in RAX.
SIZE_ARG: dict[str, str] = {
    "malloc": "arg0", "calloc": "arg0 * arg1", "realloc": "arg1", "posix_memalign": "arg2",
    "aligned_alloc": "arg1", "memalign": "arg1", "valloc": "arg0", "pvalloc": "arg0",
    "mallocx": "arg0", "rallocx": "arg1",
    "mi_malloc": "arg0", "mi_calloc": "arg0 * arg1", "mi_zalloc": "arg0", "mi_realloc": "arg1",
    "mi_malloc_aligned": "arg0", "mi_zalloc_aligned": "arg0", "mi_realloc_aligned": "arg1",
    "mi_new": "arg0",
    GO_MALLOC: 'reg("ax")',
    **{name: "arg0" for name in NEW},
}
# jemalloc built with a prefix: je_ (--with-jemalloc-prefix=je_), _rjem_ (Rust's
# tikv-jemallocator, linked into the executable).
_JE_BASE = ("malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "mallocx",
            "rallocx")
_JE = tuple(f"{prefix}{n}" for prefix in ("je_", "_rjem_") for n in _JE_BASE)
SIZE_ARG.update({name: SIZE_ARG[name.removeprefix("je_").removeprefix("_rjem_")]
                 for name in _JE})


@dataclass(frozen=True)
class Family:
    name: str
    signatures: tuple[str, ...]  # any one defined symbol marks an object as this allocator
    entries: tuple[str, ...]  # probed where defined, in this order (first name per address)
    sections: tuple[str, ...] = ()  # sections that mark it even without symbols


# First match wins: jemalloc, tcmalloc and mimalloc also define malloc and even
# __libc_malloc, so glibc comes last.
FAMILIES: tuple[Family, ...] = (
    Family("go", (GO_MALLOC,), (GO_MALLOC,), sections=(".go.buildinfo", ".note.go.buildid")),
    Family("jemalloc", ("mallocx", "je_mallocx", "je_malloc", "_rjem_mallocx"),
           STD + ("mallocx", "rallocx") + _JE + NEW),
    # gperftools (tc_malloc) and Google's newer tcmalloc (TCMallocInternalMalloc)
    Family("tcmalloc", ("tc_malloc", "TCMallocInternalMalloc"), STD + NEW),
    Family("mimalloc", ("mi_malloc",),
           STD + ("mi_malloc", "mi_calloc", "mi_zalloc", "mi_realloc", "mi_malloc_aligned",
                  "mi_zalloc_aligned", "mi_realloc_aligned", "mi_new") + NEW),
    # Dynamic musl exports __dls2b/__dls3 (its loader stages); static musl keeps the
    # internal names of mallocng (1.2) or oldmalloc (1.1) in .symtab. musl forwards
    # memalign/posix_memalign/valloc to aligned_alloc, which is probed.
    Family("musl", ("__dls3", "__dls2b", "__libc_malloc_impl", "__malloc_alloc_meta",
                    "__bin_chunk", "__expand_heap", "__simple_malloc"),
           ("malloc", "calloc", "realloc", "aligned_alloc")),
    Family("glibc", ("gnu_get_libc_version", "_int_malloc", "main_arena", "__libc_malloc"), STD),
    # Runtimes whose own allocators serve objects without calling any entry point that a
    # uprobe can see: recognised, so that zero calls elsewhere is unknown, not a pass.
    Family("cpython", ("PyObject_Malloc",), ()),
    Family("jvm", ("JNI_CreateJavaVM",), ()),
)
UNPROBEABLE = {
    "cpython": "CPython's object allocator (pymalloc) serves small objects from its own "
               "arenas, and optimised builds inline its entry points, so its calls cannot be "
               "counted",
    "jvm": "the JVM allocates objects by bumping a pointer in thread-local buffers, with no "
           "call to count",
}
FAMILY_NAMES = tuple(f.name for f in FAMILIES)
UNRECOGNISED = "unrecognised"
_WANTED = frozenset(n for f in FAMILIES for n in (*f.signatures, *f.entries))


# -- /proc/PID/maps ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    start: int
    end: int
    perms: str
    inode: int
    path: str  # as the process sees it; "" for anonymous memory
    offset: int = 0  # of the mapping in the file

    @property
    def executable(self) -> bool:
        return "x" in self.perms

    def map_file(self, pid: int) -> str:
        """The kernel's link to the mapped file: valid whatever the process's namespace."""
        return f"/proc/{valid_pid(pid)}/map_files/{self.start:x}-{self.end:x}"


_MAPS_RE = re.compile(r"([0-9a-f]+)-([0-9a-f]+) ([-rwxps]{4}) ([0-9a-f]+) [0-9a-f]+:[0-9a-f]+ "
                      r"([0-9]+)(?: +(.*))?")


def parse_maps(text: str) -> list[Region]:
    """``/proc/PID/maps`` -> mappings (pure). A line of another shape is a ParseError."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _MAPS_RE.fullmatch(line.rstrip("\n"))
        if not m:
            raise ParseError(f"maps line {n}: unexpected format {line[:80]!r}")
        out.append(Region(int(m[1], 16), int(m[2], 16), m[3], int(m[5]), m[6] or "",
                          int(m[4], 16)))
    return out


def mapped_objects(maps: Iterable[Region]) -> list[Region]:
    """One executable mapping per file (the first), in map order: the code a process runs."""
    seen: set[tuple[str, int]] = set()
    out = []
    for m in maps:
        if m.executable and m.inode and m.path.startswith("/") and (m.path, m.inode) not in seen:
            seen.add((m.path, m.inode))
            out.append(m)
    return out


# -- symbols -> allocator (pure) ----------------------------------------------------------------

@dataclass(frozen=True)
class ObjectSymbols:
    """What the allocator tables need from one ELF object."""

    defined: Mapping[str, int]  # wanted symbols defined here -> address (functions: their entry)
    sections: frozenset[str]
    has_symtab: bool


def classify(obj: ObjectSymbols) -> str | None:
    """The allocator family of one object, ``unrecognised`` for an object that defines
    ``malloc`` but matches none, None for an object that is no allocator."""
    for fam in FAMILIES:
        if any(s in obj.defined for s in fam.signatures) or obj.sections & set(fam.sections):
            return fam.name
    return UNRECOGNISED if "malloc" in obj.defined else None


def entry_points(family: str, obj: ObjectSymbols) -> tuple[str, ...]:
    """The entry points of ``family`` defined in ``obj``, one name per address: aliases
    (tcmalloc's malloc is tc_malloc) would otherwise count each call twice."""
    names = next((f.entries for f in FAMILIES if f.name == family), STD)
    seen: set[int] = set()
    out = []
    for name in names:
        addr = obj.defined.get(name)
        if addr is not None and addr not in seen:
            seen.add(addr)
            out.append(name)
    return tuple(out)


def read_symbols(path: str) -> ObjectSymbols:
    """Read the wanted symbols of the ELF file at ``path`` (pyelftools)."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
        from elftools.elf.sections import SymbolTableSection
    except ImportError as exc:  # a dependency of tailgate; said, not crashed on
        raise SourceError("pyelftools is not installed (pip install pyelftools)") from exc

    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            sections = frozenset(s.name for s in elf.iter_sections())
            defined: dict[str, int] = {}
            has_symtab = False
            for sec in elf.iter_sections():
                if not isinstance(sec, SymbolTableSection):
                    continue
                has_symtab = has_symtab or sec.name == ".symtab"
                for sym in sec.iter_symbols():
                    if sym.name in _WANTED and sym["st_shndx"] != "SHN_UNDEF":
                        defined.setdefault(sym.name, sym["st_value"])
    except OSError as exc:
        raise SourceError(exc.strerror or str(exc)) from exc
    except (ELFError, ValueError, KeyError) as exc:  # pyelftools on a malformed file
        raise ParseError(f"not a readable ELF file: {exc}") from exc
    return ObjectSymbols(defined, sections, has_symtab)


# -- one process ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Allocator:
    """One allocator in one process: what to attach uprobes to."""

    family: str
    object: str  # the path as the process sees it (its mount namespace)
    file: str  # /proc/PID/map_files/START-END: the same file from here
    ident: tuple[int, int]  # (st_dev, st_ino): one set of uprobes per file, whoever maps it
    entries: tuple[str, ...]

    def to_json(self) -> dict:
        return {"family": self.family, "object": self.object, "entries": list(self.entries)}


@dataclass(frozen=True)
class Detection:
    pid: int
    allocators: tuple[Allocator, ...]
    problems: tuple[str, ...]  # what could not be probed: with zero calls, unknown

    def to_json(self) -> dict:
        return {"allocators": [a.to_json() for a in self.allocators],
                "unprobed": list(self.problems)}


def _name(path: str) -> str:
    return os.path.basename(path.removesuffix(" (deleted)")) or path


def judge_object(m: Region, pid: int, obj: ObjectSymbols, ident: tuple[int, int]
                 ) -> tuple[Allocator | None, str | None]:
    """One mapped object -> the allocator to probe and/or the problem that prevents it (pure)."""
    family = classify(obj)
    if family is None:
        return None, None
    where = _name(m.path)
    if family in UNPROBEABLE:
        return None, f"{family} runtime in {where}: {UNPROBEABLE[family]}"
    entries = entry_points(family, obj)
    if not entries:
        why = ("its symbol table is stripped" if not obj.has_symtab
               else "none of them is in its symbol table")
        want = GO_MALLOC if family == "go" else "malloc & co"
        return None, f"{family} allocator in {where}: cannot probe {want}: {why}"
    alloc = Allocator(family, m.path, m.map_file(pid), ident, entries)
    if family == UNRECOGNISED:
        return alloc, (f"{where} defines malloc but is no allocator tailgate knows (glibc, musl, "
                       "jemalloc, tcmalloc, mimalloc, Go): its other entry points are not probed")
    return alloc, None


def detect(pid: int, proc: str = "/proc") -> Detection:
    """The allocators of live process ``pid``. SourceError if its maps cannot be read."""
    pid = valid_pid(pid)
    try:
        with open(f"{proc}/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            maps = parse_maps(fh.read())
    except OSError as exc:
        raise SourceError(f"/proc/{pid}/maps: {exc.strerror or exc}") from exc
    allocators: list[Allocator] = []
    problems: list[str] = []
    for m in mapped_objects(maps):
        handle = m.map_file(pid).replace("/proc", proc, 1)
        try:
            st = os.stat(handle)  # follows the link to the mapped file itself
            if not os.path.isfile(handle):
                raise SourceError("not a regular file")
            obj = read_symbols(handle)
        except (OSError, SourceError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            problems.append(f"cannot read the symbols of {_name(m.path)} ({m.path}): {why}")
            continue
        alloc, problem = judge_object(m, pid, obj, (st.st_dev, st.st_ino))
        if alloc:
            allocators.append(alloc)
        if problem:
            problems.append(problem)
    if not allocators and not problems:
        problems.append("no allocator found in its mappings or symbols (a static binary "
                        "without a symbol table?)")
    return Detection(pid, tuple(allocators), tuple(problems))
