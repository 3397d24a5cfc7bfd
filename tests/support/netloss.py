"""Random packet loss on an interface the test made: a tiny eBPF classifier that answers
TC_ACT_SHOT for a share of the packets, loaded with the bpf(2) syscall (this kernel has no
netem and no gact action module; MACHINE.md) and attached with `tc ... bpf da pinned`.

    with Veth() as v:                # host side v.host (10.200.N.1), namespace v.ns (10.200.N.2)
        v.run(["nginx", ...])        # inside the namespace
        with random_loss(v.host, 0.05): ...
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

NR_BPF = 321  # x86_64
BPF_PROG_LOAD, BPF_OBJ_PIN = 5, 6
SCHED_CLS = 3
libc = ctypes.CDLL(None, use_errno=True)


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def drop_program(share: float) -> bytes:
    """r0 = bpf_get_prandom_u32(); return r0 < share * 2^32 ? TC_ACT_SHOT : TC_ACT_OK."""
    threshold = int(share * 2**32)
    threshold = threshold - 2**32 if threshold >= 2**31 else threshold  # imm is s32
    return b"".join([
        _insn(0x85, imm=7),                 # call bpf_get_prandom_u32
        _insn(0xA6, dst=0, off=2, imm=threshold),  # if w0 < imm (unsigned, jmp32) goto +2
        _insn(0xB7, dst=0, imm=0),          # r0 = TC_ACT_OK
        _insn(0x95),                        # exit
        _insn(0xB7, dst=0, imm=2),          # r0 = TC_ACT_SHOT
        _insn(0x95),                        # exit
    ])


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, 128)
    fd = libc.syscall(NR_BPF, cmd, buf, 128)
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd}): {os.strerror(ctypes.get_errno())}")
    return fd


def load_and_pin(share: float, path: str) -> None:
    prog = ctypes.create_string_buffer(drop_program(share))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    n = len(prog.raw) // 8
    attr = struct.pack("<IIQQIIQ", SCHED_CLS, n, ctypes.addressof(prog), ctypes.addressof(lic),
                       1, len(log), ctypes.addressof(log))
    try:
        fd = _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror}: {log.value.decode(errors='replace')}") from exc
    try:
        p = ctypes.create_string_buffer(path.encode())
        _bpf(BPF_OBJ_PIN, struct.pack("<QI", ctypes.addressof(p), fd))
    finally:
        os.close(fd)


@contextlib.contextmanager
def bpffs() -> Iterator[str]:
    """A private bpffs mount for the pinned program, removed afterwards."""
    d = tempfile.mkdtemp(prefix="tailgate-bpffs-")
    subprocess.run(["mount", "-t", "bpf", "bpf", d], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", d], check=False)
        os.rmdir(d)


@contextlib.contextmanager
def random_loss(dev: str, share: float, netns: str | None = None) -> Iterator[None]:
    """Drop ``share`` of the packets arriving on ``dev`` (in ``netns``) until exit."""
    pre = ["ip", "netns", "exec", netns] if netns else []
    with bpffs() as d:
        path = f"{d}/drop"
        load_and_pin(share, path)
        subprocess.run([*pre, "tc", "qdisc", "add", "dev", dev, "clsact"], check=True)
        try:
            subprocess.run([*pre, "tc", "filter", "add", "dev", dev, "ingress", "bpf", "da",
                            "pinned", path], check=True, capture_output=True)
            yield
        finally:
            subprocess.run([*pre, "tc", "qdisc", "del", "dev", dev, "clsact"], check=False)


class Veth:
    """A network namespace joined to the host by a veth pair, both removed on exit."""

    def __init__(self, subnet: int = 201) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns, self.host, self.peer = f"tg-{tag}", f"tgh{tag}", f"tgn{tag}"
        self.host_ip, self.ns_ip = f"10.{subnet}.0.1", f"10.{subnet}.0.2"

    def __enter__(self) -> Veth:
        cmds = [["ip", "netns", "add", self.ns],
                ["ip", "link", "add", self.host, "type", "veth", "peer", "name", self.peer],
                ["ip", "link", "set", self.peer, "netns", self.ns],
                ["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host],
                ["ip", "link", "set", self.host, "up"],
                ["ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/24", "dev", self.peer],
                ["ip", "-n", self.ns, "link", "set", self.peer, "up"],
                ["ip", "-n", self.ns, "link", "set", "lo", "up"]]
        try:
            for c in cmds:
                subprocess.run(c, check=True, capture_output=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "link", "del", self.host], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], check=False, capture_output=True)
