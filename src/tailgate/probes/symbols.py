"""Name code addresses of a live process, from its maps and the ELF symbols of what it maps.

The malloc probe records return addresses as integers and tailgate names them here,
instead of asking bpftrace to (``usym``/``ustack``): bpftrace 0.17 was seen to stop its
output silently while symbolising the stacks of processes in other mount namespaces.
Files are read through ``/proc/PID/map_files/`` (any namespace, deleted files too).
An address outside any function stays a hex number, never a guess.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass

from ..host import valid_pid
from ..model import SourceError
from .allocators import Region, parse_maps


@dataclass(frozen=True)
class FunctionTable:
    """One ELF file's functions, sorted by address, and its loadable segments."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    names: tuple[str, ...]
    segments: tuple[tuple[int, int, int], ...]  # (p_offset, p_filesz, p_vaddr) of PT_LOAD

    def vaddr(self, file_offset: int) -> int | None:
        for off, size, vaddr in self.segments:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return None
        start, size = self.starts[i], self.sizes[i]
        if size and vaddr >= start + size:
            return None  # between functions: a stripped static function, not this one
        return self.names[i], vaddr - start


def read_functions(path: str) -> FunctionTable:
    """All function symbols of the ELF file at ``path`` (.symtab and .dynsym)."""
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
        from elftools.elf.sections import SymbolTableSection
    except ImportError as exc:  # a dependency of tailgate; said, not crashed on
        raise SourceError("pyelftools is not installed (pip install pyelftools)") from exc

    funcs: dict[int, tuple[int, str]] = {}
    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            segments = tuple((seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
                             for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD")
            for sec in elf.iter_sections():
                if not isinstance(sec, SymbolTableSection):
                    continue
                for sym in sec.iter_symbols():
                    if (sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC")
                            and sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]
                            and sym.name and sym["st_value"] not in funcs):
                        funcs[sym["st_value"]] = (sym["st_size"], sym.name)
    except OSError as exc:
        raise SourceError(exc.strerror or str(exc)) from exc
    except (ELFError, ValueError, KeyError) as exc:
        raise SourceError(f"not a readable ELF file: {exc}") from exc
    order = sorted(funcs)
    return FunctionTable(tuple(order), tuple(funcs[a][0] for a in order),
                         tuple(funcs[a][1] for a in order), segments)


@functools.cache
def _cxa_demangle():
    """libstdc++'s own demangler (what c++filt and bpftrace use), or None without it."""
    name = ctypes.util.find_library("stdc++")
    try:
        fn = ctypes.CDLL(name or "libstdc++.so.6").__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                   ctypes.POINTER(ctypes.c_int)]
    return fn


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """``_ZL20handle_request_alloci`` -> ``handle_request_alloc(int)``; anything else as is."""
    fn = _cxa_demangle() if name.startswith("_Z") else None
    if fn is None:
        return name
    status = ctypes.c_int(-1)
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


class Symbolizer:
    """``Symbolizer(pid)(address)`` -> ``(function, offset)`` or None. Reads each mapped
    file once, when an address first falls in it."""

    def __init__(self, pid: int, proc: str = "/proc"):
        self.pid = valid_pid(pid)
        self.proc = proc
        try:
            with open(f"{proc}/{self.pid}/maps", encoding="utf-8", errors="replace") as fh:
                maps = parse_maps(fh.read())
        except OSError as exc:
            raise SourceError(f"/proc/{self.pid}/maps: {exc.strerror or exc}") from exc
        self.regions = sorted((m for m in maps if m.path.startswith("/")), key=lambda m: m.start)
        self.specials = [m for m in maps if m.path.startswith("[")]  # [vdso], [stack], ...
        self._starts = [m.start for m in self.regions]
        self._tables: dict[tuple[int, int], FunctionTable | None] = {}

    def _table(self, m: Region) -> FunctionTable | None:
        handle = f"{self.proc}/{self.pid}/map_files/{m.start:x}-{m.end:x}"
        try:
            st = os.stat(handle)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino)
        if key not in self._tables:
            try:
                self._tables[key] = read_functions(handle)
            except SourceError:
                self._tables[key] = None
        return self._tables[key]

    def path(self, addr: int) -> str | None:
        """The file mapped at ``addr``, or the kernel's name of the mapping ("[vdso]"); None:
        anonymous memory or nothing."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self.regions[i].end:
            return self.regions[i].path
        return next((m.path for m in self.specials if m.start <= addr < m.end), None)

    def __call__(self, addr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0 or addr >= self.regions[i].end:
            return None
        m = self.regions[i]
        table = self._table(m)
        if table is None:
            return None
        vaddr = table.vaddr(addr - m.start + m.offset)
        return table.lookup(vaddr) if vaddr is not None else None


def name_addresses(pid: int, addresses: set[int], proc: str = "/proc") -> dict[int, str]:
    """``{address: "function+offset"}`` for the addresses that fall in a function of
    ``pid``; empty when its maps cannot be read (it exited)."""
    try:
        sym = Symbolizer(pid, proc)
    except (SourceError, ValueError):  # exited, or a pid this kernel cannot have
        return {}
    out = {}
    for addr in addresses:
        found = sym(addr)
        if found:
            out[addr] = f"{demangle(found[0])}+{found[1]}"
    return out
