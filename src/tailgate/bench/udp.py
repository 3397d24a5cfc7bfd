"""``udp://host:port``: open-loop datagrams to an echo server, each one's latency, loss
counted and never hidden.

Datagram ``i`` of ``--size`` bytes is due at ``i / rate`` (``--rate max``: as fast as the
path takes, each due when sent). The compiled loop (``udploop.c``) sends what is due in
calls of up to ``--batch`` datagrams (``send``/``recv`` for 1, ``sendmmsg``/``recvmmsg``
above; ``--io io_uring``: the same batches through io_uring with a registered socket and a
multishot receive into registered provided buffers) and stamps each datagram's send and
its echo. Here those stamps become the bench document every other load produces
(``tailgate_bench: 1``): latency from the intended start (coordinated omission counted),
service time from the send, lateness, outcomes ``ok``, ``lost`` (no echo within
``--timeout``; recorded at the time-out, as a request's time-out is) and ``connect`` (the
kernel refused the send: ICMP unreachable), and a ``packets`` block: rates, loss,
reordering, duplicates, malformed echoes, syscalls and CPU per datagram.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import UsageError
from ..slo import parse_slo
from ..units import parse_size
from .outcome import CODE, KINDS
from .protocols import Protocol
from .target import RequestOptions, Target, TargetError, _host_port

try:
    from . import udploop  # type: ignore[attr-defined]

    UNAVAILABLE: str | None = None
except ImportError as exc:
    udploop = None
    UNAVAILABLE = (f"the compiled datagram loop (tailgate.bench.udploop) is not built: {exc}; "
                   "reinstall with a C compiler (Debian: gcc python3-dev; pip install -e .)")

IO_MODES = ("syscalls", "io_uring")
DEFAULT_SIZE = 64
DEFAULT_BATCH = 32
MAX_BATCH = 1024
HEADER = 16  # magic and index: the smallest datagram
MAX_SIZE = 65507  # the largest UDP payload over IPv4
# Two stamps (16 bytes) a datagram are held: 50 million is 800 MB at most (pages of a
# --rate max run are touched only as far as it got).
MAX_DATAGRAMS = 50_000_000
SOCKET_BUFFER = 4 << 20  # asked for; the kernel caps it at net.core.[rw]mem_max
KINDS_UDP = ("connect", "lost")


@dataclass(frozen=True)
class UdpSettings:
    """What each datagram is and how it goes to the kernel."""

    size: int = DEFAULT_SIZE
    batch: int = DEFAULT_BATCH
    io: str = "syscalls"
    max_rate: bool = False  # --rate max

    def json(self) -> dict[str, Any]:
        return {"size": self.size, "batch": self.batch, "io": self.io,
                "rate": "max" if self.max_rate else "scheduled"}


def udp_target(url: str, secure: bool, o: RequestOptions) -> Target:
    host, port, path = _host_port(url, None)
    if path not in ("/", ""):
        raise TargetError(f"a udp:// target is udp://host:port, without a path ({path!r})")
    o.no_tcp_options()
    return Target(url, "udp", host, port, b"")


def _no_python_engine(engine: Any, cfg: Any) -> Any:
    raise UsageError("udp:// runs on the compiled datagram loop only")


BENCH_PROTOCOL = Protocol(
    kind="udp", schemes={"udp": False}, usage="udp://host:port",
    flags=("--size", "--batch", "--io"), kinds=KINDS_UDP, default_timeout="1s",
    target=udp_target, connections=_no_python_engine, parse_slo=parse_slo)


# -- the spec ---------------------------------------------------------------------------------

def settings_of(opts: Any) -> UdpSettings:
    """--size, --batch and --io, checked (a usage error names the option)."""
    try:
        size = parse_size(opts.size) if opts.size is not None else DEFAULT_SIZE
    except ValueError as exc:
        raise UsageError(f"--size: {exc}") from None
    if not HEADER <= size <= MAX_SIZE:
        raise UsageError(f"--size must be {HEADER}..{MAX_SIZE} bytes (a datagram carries a "
                         f"{HEADER}-byte header), not {size}")
    batch = opts.batch if opts.batch is not None else DEFAULT_BATCH
    if not 1 <= batch <= MAX_BATCH:
        raise UsageError(f"--batch must be 1..{MAX_BATCH}, not {batch}")
    io = opts.io or "syscalls"
    if io not in IO_MODES:
        raise UsageError(f"--io must be {' or '.join(IO_MODES)}, not {io!r}")
    return UdpSettings(size, batch, io, max_rate=str(opts.rate).strip().lower() == "max")


def count(rate: float, duration: float | None, warmup: float, requests: int | None) -> int:
    """The datagrams the arrays hold: the schedule's (warm-up included), or as many as a
    --rate max run may send (it stops at --duration)."""
    if rate == 0.0:
        return min(requests, MAX_DATAGRAMS) if requests is not None else MAX_DATAGRAMS
    n = int(np.ceil(rate * (warmup + duration) - 1e-9)) if duration is not None else None
    if requests is not None:
        n = requests + int(np.ceil(rate * warmup - 1e-9)) if n is None else min(n, requests)
    return int(n)


# -- the run ----------------------------------------------------------------------------------

def _socket(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    fam, _, _, _, addr = infos[0]
    sock = socket.socket(fam, socket.SOCK_DGRAM)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
    sock.connect(addr)
    return sock


def run(spec: Any, hooks: Any = None) -> Any:
    """Send the datagrams of ``spec`` and return its BenchResult (``packets`` added)."""
    from .result import build_result

    info, s, n = spec.info, spec.engine_fields["udp"], int(spec.engine_fields["n"])
    try:
        sock = _socket(spec.target.host, spec.target.port)
    except OSError as exc:
        raise UsageError(f"{info.target}: {exc.strerror or exc}") from None
    send = np.zeros(n, dtype=np.int64)
    recv = np.zeros(n, dtype=np.int64)
    period = 0 if s.max_rate else max(int(round(1e9 / info.rate)), 1)
    start = time.monotonic_ns() + 2_000_000
    box: dict[str, Any] = {}

    def loop() -> None:
        try:
            box["res"] = udploop.run(
                fd=sock.fileno(), size=s.size, batch=s.batch,
                mode=udploop.MODE_URING if s.io == "io_uring" else udploop.MODE_SYSCALL, n=n,
                period_ns=period,
                duration_ns=int((info.warmup_s + info.duration_s) * 1e9) if s.max_rate else 0,
                timeout_ns=int(info.timeout_s * 1e9), send_ns=send, recv_ns=recv,
                start_ns=start)
        except (OSError, ValueError) as exc:
            box["err"] = exc

    udploop.reset()
    th = threading.Thread(target=loop, name="udploop", daemon=True)
    interrupted = False
    if hooks is not None and hooks.on_start is not None:
        hooks.on_start(start / 1e9)
    th.start()
    try:
        while th.is_alive():
            th.join(0.2)
    except KeyboardInterrupt:
        interrupted = True
        udploop.stop()
        th.join()
    finally:
        sock.close()
    if "err" in box:
        raise UsageError(f"udp:// ({s.io}): {box['err']}")
    res = box["res"]
    interrupted = interrupted or bool(res["stopped"])
    part, block = _measure(info, s, n, res, send, recv, interrupted)
    # --rate max has no rate to test the sends against (a stand-in keeps arrival_test whole;
    # its block is replaced below)
    result = build_result(replace(info, rate=1.0, arrival="constant") if s.max_rate else info,
                          [part], interrupted)
    result.info = info
    result.stopped = interrupted
    data = result.json
    data["config"]["udp"] = s.json()
    if s.max_rate:
        data["rate"]["target"] = data["config"]["rate"] = None
        data["config"]["arrival"] = "max"
        data["arrivals"] = {"distribution": "max", "samples": part.dispatched,
                            "verdict": "unknown",
                            "statement": "--rate max: no schedule to test the sends against"}
        data["warnings"] = [w for w in data["warnings"] if not w.startswith("arrivals")]
    block["pps_sent"] = round(block["sent"] / data["duration_s"], 1) if data["duration_s"] else 0.0
    block["pps_echoed"] = round(block["echoed"] / data["duration_s"], 1) \
        if data["duration_s"] else 0.0
    data["packets"] = block
    data["warnings"] += _warnings(block)
    from ..slo import evaluate

    data["slo"] = evaluate(list(spec.slos), data)
    data["clock"] = {"start_monotonic_s": start / 1e9,
                     "start_epoch_s": time.time() + (start / 1e9 - time.monotonic())}
    result.start_epoch_s = data["clock"]["start_epoch_s"]
    return result


def _measure(info: Any, s: UdpSettings, n: int, res: dict[str, Any], send: np.ndarray,
             recv: np.ndarray, interrupted: bool) -> tuple[Any, dict[str, Any]]:
    """The loop's stamps as one worker's result, and the ``packets`` block."""
    from ..hist import Histogram
    from .engine_types import WorkerResult

    spec = info.spec
    t0, sent = int(res["t0_ns"]), int(res["sent"])
    timeout = int(info.timeout_s * 1e9)
    warm_ns = int(info.warmup_s * 1e9)
    S, R = send[:sent], recv[:sent]
    if s.max_rate:
        intended = S
        n_sched_warm = int(np.count_nonzero(S < t0 + warm_ns))
        scheduled_measured = sent - n_sched_warm
    else:
        period = 1e9 / info.rate
        intended = t0 + np.round(np.arange(sent, dtype=np.float64) * period).astype(np.int64)
        n_sched_warm = int(np.ceil(info.rate * info.warmup_s - 1e-9))
        scheduled_measured = n - min(n_sched_warm, n)
    m = intended >= t0 + warm_ns  # measured (after the warm-up)
    iS, iR, iI = S[m], R[m], intended[m]
    refused = iR < 0
    echo_lat = iR - iI
    ok = (iR > 0) & (echo_lat <= timeout)
    lost = ~ok & ~refused
    late = int(np.count_nonzero((iR > 0) & ~ok))
    lateness = np.maximum(iS - iI, 0)
    latency = np.where(ok, echo_lat, np.where(lost, timeout, lateness))
    lat_h, srv_h, late_h = Histogram(spec), Histogram(spec), Histogram(spec)
    lat_h.record(latency)
    srv_h.record(iR[ok] - iS[ok])
    late_h.record(lateness)
    intervals: dict[int, Histogram] = {}
    step = int(info.hdr_interval_s * 1e9) if info.hdr_interval_s else 0
    if step and latency.size:
        k = (iI - t0 - warm_ns) // step
        edges = np.flatnonzero(np.diff(k)) + 1
        for lo, hi in zip(np.r_[0, edges], np.r_[edges, k.size], strict=True):
            h = Histogram(spec)
            h.record(latency[lo:hi])
            intervals[int(k[lo])] = h
    counts = [0] * len(KINDS)
    counts[CODE["ok"]] = int(np.count_nonzero(ok))
    counts[CODE["lost"]] = int(np.count_nonzero(lost))
    counts[CODE["connect"]] = int(np.count_nonzero(refused))
    examples: dict[str, dict[str, int]] = {}
    if counts[CODE["lost"]]:
        examples["lost"] = {f"no echo within the time-out ({info.timeout_s:g} s)":
                            counts[CODE["lost"]] - late}
        if late:
            examples["lost"][f"echo later than the time-out ({info.timeout_s:g} s)"] = late
    if counts[CODE["connect"]]:
        codes, num = np.unique(-iR[refused], return_counts=True)
        examples["connect"] = {f"send refused: {os.strerror(int(c))} "
                               f"({errno.errorcode.get(int(c), c)})": int(k)
                               for c, k in zip(codes, num, strict=True)}
    dispatched = int(m.sum())
    part = WorkerResult(
        worker=0, counts=counts, latency=lat_h, service=srv_h, lateness=late_h,
        intervals=intervals, scheduled=scheduled_measured, dispatched=dispatched,
        abandoned=scheduled_measured - dispatched if interrupted else 0,
        last_dispatch_s=float((iS.max() - t0) / 1e9) if iS.size else 0.0, queued=0,
        connections={"opened": 1, "connect_failures": 0, "max_open": 1, "cap": 1},
        interrupted=interrupted, precise_timer=True, log_path=None,
        warmup_requests=sent - dispatched, cpu_s=float(res["cpu_s"]), sent=dispatched,
        error_examples=examples,
        arrivals_s=((iS - t0) / 1e9) if not s.max_rate else np.zeros(0),
        engine="fast")
    if not interrupted and not s.max_rate and dispatched < scheduled_measured:
        raise AssertionError(f"udploop sent {dispatched} of {scheduled_measured} scheduled")
    all_sent = max(sent, 1)
    block = {**s.json(), "sent": dispatched, "echoed": counts[CODE["ok"]],
             "lost": counts[CODE["lost"]], "late_echoes": late,
             "refused": counts[CODE["connect"]],
             "loss_pct": round(100.0 * counts[CODE["lost"]] / dispatched, 6) if dispatched else None,
             # over the whole run (warm-up included): the loop reports its own totals
             "reordered": int(res["reordered"]), "duplicate": int(res["duplicate"]),
             "malformed": int(res["malformed"]),
             # ICMP errors (port unreachable, ...) a receive reported: the datagram behind
             # each is among the lost; one a send reported is that datagram's `connect`
             "icmp_errors": int(res["icmp_errors"]),
             "send_calls": int(res["send_calls"]), "recv_calls": int(res["recv_calls"]),
             "datagrams_per_send_call": round(sent / max(int(res["send_calls"]), 1), 3),
             "cpu_s": round(float(res["cpu_s"]), 6),
             # the loop thread's CPU (user + system) per datagram sent, its echo's receive
             # included: the syscall tax the batch and io_uring cut
             "cpu_ns_per_packet": round(1e9 * float(res["cpu_s"]) / all_sent, 1)}
    return part, block


def _warnings(block: dict[str, Any]) -> list[str]:
    out = []
    if block["lost"]:
        out.append(f"{block['lost']:,} of {block['sent']:,} datagrams lost "
                   f"({block['loss_pct']:.3g} %): no echo within the time-out")
    for key, what in (("reordered", "arrived after a later datagram's echo"),
                      ("duplicate", "echoed more than once"),
                      ("malformed", "not one of ours (wrong length, magic or index)")):
        if block[key]:
            out.append(f"{block[key]:,} echo(es) {what}")
    return out
