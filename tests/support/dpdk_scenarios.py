"""The DPDK scenarios the tests (and the fixture capture) run against a real testpmd.

Each scenario makes its own network namespace (removed afterwards), starts testpmd on a
port there, and drives traffic into that port from the kernel side with a bounded UDP
sender, so nothing leaves the namespace. ``sample_pair`` takes tailgate's two samples of
the process while the sender runs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

from tailgate.collect import Scope, collectors, run_collector
from tailgate.host import Host
from tailgate.model import Snapshot
from tailgate.sources.dpdk import read_process

from .testpmd import Testpmd, netns_sh

SENDER = r"""
import socket, sys, time
dst, seconds, count, flows = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rate = float(sys.argv[5])  # packets per second, 0: as fast as it can
burst = int(sys.argv[6])  # sent unpaced first
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload = b"x" * 18
print("start", flush=True)
start = time.monotonic()
deadline = start + seconds
sent = 0
while sent < count and time.monotonic() < deadline:
    if rate and sent > burst and sent - burst > rate * (time.monotonic() - start):
        time.sleep(256 / rate)
        continue
    for i in range(256):
        try:
            s.sendto(payload, (dst, 20000 + (sent + i) % flows))
        except OSError:  # ENOBUFS when the device queue is full: keep offering load
            pass
    sent += 256
print(sent, flush=True)
"""

PEER = "10.77.0.2"  # a static neighbour: frames go out the port, nobody needs to answer


@contextlib.contextmanager
def netns() -> Iterator[str]:
    name = f"tg-dpdk-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        netns_sh(name, "ip", "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def _address(ns: str, dev: str) -> None:
    netns_sh(ns, "ip", "link", "set", dev, "up")
    netns_sh(ns, "ip", "addr", "add", "10.77.0.1/24", "dev", dev)
    netns_sh(ns, "ip", "neigh", "replace", PEER, "lladdr", "02:00:00:00:00:02", "dev", dev)


@contextlib.contextmanager
def tap_port(ns: str, app: list[str], *, mbufs: int = 8192,
             interactive: bool = False) -> Iterator[Testpmd]:
    """testpmd on a tap port created inside ``ns`` (the kernel side is dtg0)."""
    with Testpmd(["--vdev", "net_tap0,iface=dtg0"], app, netns=ns, mbufs=mbufs,
                 interactive=interactive) as pmd:
        _address(ns, "dtg0")
        yield pmd


@contextlib.contextmanager
def pcap_port(ns: str, app: list[str], *, mbufs: int = 8192) -> Iterator[Testpmd]:
    """testpmd capturing a veth end (vtg0) through libpcap; the kernel sends on vtg1."""
    netns_sh(ns, "ip", "link", "add", "vtg0", "type", "veth", "peer", "name", "vtg1")
    netns_sh(ns, "ip", "link", "set", "vtg0", "up")
    _address(ns, "vtg1")
    # rx_iface_in: capture only what arrives, or testpmd would read back what it sends itself
    with Testpmd(["--vdev", "net_pcap0,rx_iface_in=vtg0,tx_iface=vtg0"], app, netns=ns,
                 mbufs=mbufs) as pmd:
        yield pmd


@contextlib.contextmanager
def traffic(ns: str, *, seconds: float, count: int, flows: int,
            rate: float = 0, burst: int = 0) -> Iterator[subprocess.Popen]:
    """A bounded UDP sender in ``ns``: at most ``count`` packets and ``seconds``, paced to
    ``rate`` packets per second when given, after an unpaced ``burst``."""
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, PEER,
                             str(seconds), str(count), str(flows), str(rate), str(burst)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "start"
        yield proc
    finally:
        try:
            proc.wait(timeout=seconds + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sample_pair(prefix: str, interval_s: float) -> Snapshot:
    """tailgate's two samples of one DPDK process, ``interval_s`` apart (the dpdk collector
    alone, as collect() runs it)."""
    c = collectors()["dpdk"]
    host, scope = Host("/"), Scope(options={"dpdk": [prefix]})
    before = run_collector(c, host, scope)
    t0 = time.monotonic()
    time.sleep(interval_s)
    facts = run_collector(c, host, scope)
    return Snapshot(host={"hostname": "test"}, target=scope.to_json(),
                    interval_s=time.monotonic() - t0, taken_at=time.time(), facts=facts,
                    before=before)


def wait_until(sock: str, predicate, limit_s: float) -> None:
    """Poll port 0's telemetry until ``predicate(port)`` holds (bounded by ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate(read_process(sock)["ports"]["0"]):
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not reached in {limit_s:g} s")


# testpmd arguments of each scenario.
# Too few mbufs for the packets held in flight: testpmd's noisy mode parks every packet in
# a 2048-entry software FIFO that is never flushed, so the 1100 mbufs run out and each
# packet after that fails its allocation (pcap allocates one mbuf per received packet).
EXHAUST_APP = ["--forward-mode=noisy", "--noisy-tx-sw-buffer-size=2048",
               "--noisy-tx-sw-buffer-flushtime=0", "--mbcache=0"]
EXHAUST_MBUFS = 1100
EXHAUST_RATE = 300  # paced: a starved forwarding core on a busy host must not overflow the capture ring
# More than one core can take: testpmd's noisy mode does 20000 random reads per packet.
OVERFLOW_APP = ["--forward-mode=noisy", "--noisy-lkup-memory=16", "--noisy-lkup-num-reads=20000"]
# Two Rx queues; the tun driver picks the queue by flow hash.
SPREAD_APP = ["--forward-mode=rxonly", "--rxq=2", "--txq=2"]
# A clean data plane: io forwarding on one pcap port at a rate it takes easily.
CLEAN_APP = ["--forward-mode=io"]
CLEAN_RATE = 300  # the libpcap ring holds ~128 packets (16 KiB blocks): idle enough for a starved core
