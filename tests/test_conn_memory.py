"""l3.conn.memory on real sockets of a real process, and its pure judgment."""

from __future__ import annotations

import sys
import textwrap

from support.inspect import inspect_ready_process
from tailgate.baseline import default_baseline
from tailgate.judge import judge
from tailgate.model import Fact, Snapshot
from tailgate.sources.sockets import parse_slabinfo, parse_ss

HOLDER = textwrap.dedent("""
    import socket, sys, time
    pairs, unread = int(sys.argv[1]), int(sys.argv[2])
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(128)
    keep = []
    for _ in range(pairs):
        c = socket.create_connection(srv.getsockname()); s, _ = srv.accept(); keep += [c, s]
    if unread:
        keep[0].setblocking(False)
        try:
            keep[0].send(b"x" * unread)  # never read by keep[1]: it stays in a receive queue
        except BlockingIOError:
            pass
    print("ready", flush=True)
    time.sleep(30)
""")


def inspect_holder(pairs: int, unread: int) -> dict:
    return inspect_ready_process([sys.executable, "-c", HOLDER, str(pairs), str(unread)],
                                 "l3.conn.memory")


def test_unread_data_makes_the_kernel_share_fail():
    f = inspect_holder(pairs=1, unread=512 * 1024)
    assert f["status"] == "fail", f
    assert f["evidence"]["connections"] == 2
    assert f["evidence"]["kernel_buffers_bytes_mean"] > 8192


def test_idle_connections_of_a_large_process_cannot_be_told():
    f = inspect_holder(pairs=20, unread=0)
    assert f["status"] == "unknown", f
    assert f["evidence"]["connections"] == 40
    assert f["evidence"]["kernel_fixed_bytes"] > 2000  # tcp_sock + inode + file
    assert "not separable" in f["reason"]


def test_pass_when_even_the_rss_bound_fits():
    snap = Snapshot(host={}, target={"pids": [7]}, interval_s=0, taken_at=0, facts={
        "kernel.slabinfo": Fact(value={"TCP": 2368, "sock_inode_cache": 832, "filp": 192}),
        "sockets.7": Fact(value={"connections": 10000, "skmem": [{"rmem_alloc": 0}] * 10000}),
        "proc.7.status": Fact(value={"name": "svc", "cpus_allowed": [0], "mems_allowed": [0],
                                     "threads": 1, "rss_bytes": 30 * 2**20})})
    (f,) = [f for f in judge(snap, default_baseline()) if f.id == "l3.conn.memory"]
    assert f.status == "pass" and f.observed == 3392 + 3146


def test_parse_ss_corpus_capture():
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "host" / "vm-ss-tmi-rcvbuf.txt").read_text()
    socks = parse_ss(text)
    assert len(socks) == 4
    assert socks[0]["skmem"]["rcvbuf"] == 10388784 and socks[1]["skmem"]["rcvbuf"] == 131072
    assert socks[3]["skmem"]["drops"] == 0 and socks[0]["skmem"]["drops"] == 4


def test_parse_slabinfo():
    text = ("slabinfo - version: 2.1\n# name <active_objs> <num_objs> <objsize> ...\n"
            "TCP                   26     26   2368   13    8 : tunables 0 0 0 : slabdata 2 2 0\n")
    assert parse_slabinfo(text) == {"TCP": 2368}
