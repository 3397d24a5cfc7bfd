"""The allocation workloads (alloc.c, alloc_go.go) built against each allocator, run plainly
or inside a PID + mount namespace (a container's view: its own /proc, and its binary and
allocator library on a tmpfs that exists only inside, so the paths in its maps mean nothing
on the host).

Builds: C with gcc (or musl-gcc) linked to glibc, musl, jemalloc, tcmalloc or mimalloc
(Debian: musl-tools, libjemalloc-dev, libgoogle-perftools-dev, libmimalloc-dev); Go with
golang-go, statically (CGO_ENABLED=0), optionally stripped (``-s -w``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from . import _BUILD, CFLAGS, HERE

# build -> (compiler, link flags, source). --no-as-needed keeps the library even where the
# compiler's own builtins would let the linker drop it. The -cxx builds allocate with
# operator new, which jemalloc, tcmalloc and mimalloc replace (never entering malloc).
C_BUILDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "glibc": ("gcc", (), "alloc.c"),
    "musl": ("musl-gcc", (), "alloc.c"),
    "musl-static": ("musl-gcc", ("-static",), "alloc.c"),
    "jemalloc": ("gcc", ("-Wl,--no-as-needed", "-ljemalloc"), "alloc.c"),
    "tcmalloc": ("gcc", ("-Wl,--no-as-needed", "-ltcmalloc"), "alloc.c"),
    "mimalloc": ("gcc", ("-Wl,--no-as-needed", "-lmimalloc"), "alloc.c"),
    "jemalloc-cxx": ("g++", ("-Wl,--no-as-needed", "-ljemalloc"), "alloc_cxx.cc"),
    "tcmalloc-cxx": ("g++", ("-Wl,--no-as-needed", "-ltcmalloc"), "alloc_cxx.cc"),
    "mimalloc-cxx": ("g++", ("-Wl,--no-as-needed", "-lmimalloc"), "alloc_cxx.cc"),
}
# The shared library each one brings (copied into the namespace's tmpfs).
LIBRARY = {"jemalloc": "libjemalloc.so", "tcmalloc": "libtcmalloc.so",
           "mimalloc": "libmimalloc.so"}
GO_BUILDS = {"go": (), "go-stripped": ("-ldflags=-s -w",)}
ALL = (*C_BUILDS, *GO_BUILDS)


# What CI installs for each tool or library (the Makefile's APT_TEST): a missing one fails
# the test with this hint, never skips it.
DEBIAN = {"musl-gcc": "musl-tools", "go": "golang-go", "g++": "g++", "gcc": "gcc",
          "-ljemalloc": "libjemalloc-dev", "-ltcmalloc": "libgoogle-perftools-dev",
          "-lmimalloc": "libmimalloc-dev"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (Debian: apt-get install {DEBIAN.get(name, name)})"
    return path


def _compile(argv: list[str], **kw) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **kw)
    hints = [DEBIAN[a] for a in argv if a in DEBIAN and a.startswith("-l")]
    assert res.returncode == 0, (f"{' '.join(argv)} failed (needs Debian {', '.join(hints)}?):"
                                 f" {res.stderr[-2000:]}" if hints else res.stderr[-2000:])


def _fresh(out: Path, src: Path) -> bool:
    return out.exists() and out.stat().st_mtime >= src.stat().st_mtime


def build(allocator: str) -> Path:
    """The alloc workload linked to ``allocator`` (built once, again when the source is newer)."""
    _BUILD.mkdir(parents=True, exist_ok=True)
    out = _BUILD / f"alloc-{allocator}"
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    if allocator in GO_BUILDS:
        src = HERE / "alloc_go.go"
        if not _fresh(out, src):
            env = {**os.environ, "CGO_ENABLED": "0", "GOCACHE": str(_BUILD / "gocache"),
                   "GOPATH": str(_BUILD / "gopath"), "GOFLAGS": "", "GO111MODULE": "off"}
            _compile([_tool("go"), "build", *GO_BUILDS[allocator], "-o", str(tmp), str(src)],
                     env=env, cwd=_BUILD)
            tmp.replace(out)
        return out
    cc, flags, source = C_BUILDS[allocator]
    src = HERE / source
    if not _fresh(out, src):
        _compile([_tool(cc), *CFLAGS, "-o", str(tmp), str(src), *flags])
        tmp.replace(out)
    return out


def library(binary: Path, allocator: str) -> Path | None:
    """The allocator's shared library as the loader resolves it for ``binary`` (ldd)."""
    prefix = LIBRARY.get(allocator.removesuffix("-cxx"))
    if prefix is None:
        return None
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    m = re.search(rf"^\s*({re.escape(prefix)}\S*) => (\S+)", out, re.M)
    assert m, f"{binary} is not linked to {prefix}: {out}"
    return Path(m[2])


class Workload:
    """A started workload: ``pid`` is its process id as seen from here (the host)."""

    def __init__(self, proc: subprocess.Popen, pid: int):
        self.proc, self.pid = proc, pid


def _ready(proc: subprocess.Popen, what: str) -> None:
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{what} did not start: {line!r} {proc.stderr.read()!r}")


def _inner_pid(outer: int) -> int:
    """The process that ``unshare --fork`` started (its only child), by its host pid."""
    kids = [int(k) for t in os.listdir(f"/proc/{outer}/task")
            for k in Path(f"/proc/{outer}/task/{t}/children").read_text().split()]
    assert len(kids) == 1, f"unshare {outer} has children {kids}"
    return kids[0]


# Inside the new namespaces: a tmpfs over an empty directory (private to the mount
# namespace: unshare makes mounts private), the binary and its allocator library copied
# onto it, and the workload exec'd as the namespace's pid 1.
_INSIDE = ('set -e; mount -t tmpfs tailgate-test "$1"; cp "$2" "$1/svc"; '
           'if [ -n "$3" ]; then cp "$3" "$1/"; fi; '
           'LD_LIBRARY_PATH="$1" exec "$1/svc" "$4" "$5"')


def start(allocator: str, mode: str, seconds: float, where: Path | None = None) -> Workload:
    """Start the workload; with ``where`` (an empty directory) inside new PID and mount
    namespaces, its files on a tmpfs mounted over ``where`` there only."""
    binary = build(allocator)
    if where is None:
        proc = subprocess.Popen([str(binary), mode, str(seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        _ready(proc, f"{binary.name} {mode}")
        return Workload(proc, proc.pid)
    lib = library(binary, allocator)
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount",
            "sh", "-c", _INSIDE, "sh", str(where), str(binary), str(lib or ""), mode,
            str(seconds)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    _ready(proc, f"{binary.name} {mode} in a namespace")
    return Workload(proc, _inner_pid(proc.pid))


def stop(w: Workload) -> None:
    for pid in {w.pid, w.proc.pid}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    w.proc.wait(timeout=10)
    for stream in (w.proc.stdout, w.proc.stderr):
        if stream:
            stream.close()


@contextlib.contextmanager
def running(*specs: tuple) -> Iterator[list[Workload]]:
    """``with running(("jemalloc", "alloc", 20), ("go", "prealloc", 20, tmp)) as ws:``"""
    ws: list[Workload] = []
    try:
        for spec in specs:
            ws.append(start(*spec))
        yield ws
    finally:
        for w in ws:
            stop(w)
