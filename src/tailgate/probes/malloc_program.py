"""The malloc probe's program: ``malloc.bt`` plus one uprobe block per allocator entry point.

The block is a fixed template. What varies is checked before it is written into
the program: the file must be ``/proc/PID/map_files/START-END`` (digits and hex
only), the entry point and its size expression come from
:data:`tailgate.probes.allocators.SIZE_ARG`, the family from the allocator
tables. Nothing read from a process (a path, a symbol name) reaches the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ..model import SourceError
from . import allocators, symbols
from .allocators import FAMILY_NAMES, SIZE_ARG, UNRECOGNISED, Allocator, Detection
from .driver import program_text
from .output import BpftraceOutput, int_key, keyed

_FILE_RE = re.compile(r"/proc/[1-9][0-9]{0,9}/map_files/[0-9a-f]{1,16}-[0-9a-f]{1,16}")
_PIDS = ("/$3 != 0 && @stop == 0 &&\n"
         " (pid == $3 || pid == $4 || pid == $5 || pid == $6 ||\n"
         "  pid == $7 || pid == $8 || pid == $9 || pid == $10)/")
END_LINE = "tailgate-malloc: end"  # printed by END after the maps (malloc.bt)
BLOCK = """
uprobe:{file}:{entry}
{pids}
{{
  @calls[pid, "{family}:{entry}"] = count();
  @bytes[pid] = sum({size});
  $fp = *(uint64 *)reg("bp");
  $fp2 = *(uint64 *)$fp;
  @sites[pid, *(uint64 *)reg("sp"), *(uint64 *)(reg("bp") + 8), *(uint64 *)($fp + 8),
         *(uint64 *)($fp2 + 8)] = count();
}}
"""


def block(alloc: Allocator, entry: str) -> str:
    if not _FILE_RE.fullmatch(alloc.file):
        raise ValueError(f"refusing to probe {alloc.file!r}: not a /proc/PID/map_files link")
    if alloc.family not in (*FAMILY_NAMES, UNRECOGNISED):
        raise ValueError(f"unknown allocator family {alloc.family!r}")
    if entry not in SIZE_ARG:
        raise ValueError(f"unknown allocator entry point {entry!r}")
    return BLOCK.format(file=alloc.file, entry=entry, pids=_PIDS, family=alloc.family,
                        size=SIZE_ARG[entry])


def render(allocators: Iterable[Allocator]) -> str:
    """The whole program; one set of uprobes per file (a uprobe fires in every process
    mapping the file, so a second set would count each call twice)."""
    seen: set[tuple[int, int]] = set()
    blocks = []
    for alloc in allocators:
        if alloc.ident in seen:
            continue
        seen.add(alloc.ident)
        blocks += [block(alloc, e) for e in alloc.entries]
    if not blocks:
        raise ValueError("no allocator entry point to probe")
    return program_text("malloc") + "".join(blocks)


def attach_shortfall(text: str, attached: int | None) -> str | None:
    """Why the run does not count everything it was written to (None when it does): bpftrace
    reports how many probes it attached; the program has one per uprobe block plus its timer."""
    expected = text.count("\nuprobe:") + 1
    if attached is None or attached < expected:
        return f"bpftrace attached {attached} of the program's {expected} probes"
    return None


def complete(printf: Iterable[str]) -> bool:
    """Whether bpftrace printed the whole output: END's last line came."""
    return any(END_LINE in chunk for chunk in printf)


def site_addresses(out: BpftraceOutput) -> dict[int, set[int]]:
    """The return addresses recorded per process (keys of @sites), to be named."""
    found: dict[int, set[int]] = {}
    for key, _n in keyed(out.map("@sites"), 5):
        addrs = [int_key(k) for k in key]
        found.setdefault(addrs[0], set()).update(a for a in addrs[1:] if a)
    return found


def name_sites(out: BpftraceOutput) -> dict[str, dict[str, str]]:
    """``{pid: {address: "function+offset"}}`` while the processes are alive (I/O)."""
    return {str(pid): {str(a): n for a, n in symbols.name_addresses(pid, addrs).items()}
            for pid, addrs in site_addresses(out).items()}


def detect_all(pids: Iterable[int], detect: Callable[[int], Detection] = allocators.detect
               ) -> dict[int, Detection]:
    """The allocators of each process; a process whose maps cannot be read has only a problem."""
    out = {}
    for pid in pids:
        try:
            out[pid] = detect(pid)
        except SourceError as exc:
            out[pid] = Detection(pid, (), (f"cannot tell its allocator: {exc}",))
    return out


def prepare(pids: Iterable[int], detect: Callable[[int], Detection] = allocators.detect
            ) -> tuple[str | None, dict[int, Detection]]:
    """Detect the allocators of ``pids`` and render the program (None: nothing to probe)."""
    detections = detect_all(pids, detect)
    found = [a for d in detections.values() for a in d.allocators]
    return (render(found) if found else None), detections
