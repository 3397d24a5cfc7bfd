"""l3.conn.memory: resident memory per long-lived connection.

The kernel's share is measured per socket: its fixed slab objects (tcp_sock,
socket inode, file) plus what skmem says it holds. The process's own share
cannot be split per connection from one RSS figure, so RSS / connections is
reported as an upper bound: it decides `pass` when even the bound is within the
limit; a kernel share alone over the limit is a `fail`; in between we cannot tell.
"""

from __future__ import annotations

from ..judge import check, need
from ..model import Result, Snapshot

HELD = ("rmem_alloc", "wmem_alloc", "fwd_alloc", "wmem_queued", "opt_mem")


@check("l3.conn.memory")
def conn_memory(snap: Snapshot, p: dict) -> list[Result]:
    pids = [int(x) for x in snap.target.get("pids") or []]
    if not pids:
        return [Result("skip", reason="no service process given (use --pid)")]
    slabs = need(snap, "kernel.slabinfo")
    fixed = max(slabs.get("TCP", 0), slabs.get("TCPv6", 0)) + slabs.get("sock_inode_cache", 0) \
        + slabs.get("filp", 0)
    # A slab cache absent from slabinfo (merged caches, SLUB aliases) counts 0: the kernel
    # share is then a lower bound, which may fail but never pass.
    absent = [n for n in ("sock_inode_cache", "filp") if n not in slabs]
    if "TCP" not in slabs and "TCPv6" not in slabs:
        absent.insert(0, "TCP")
    results = []
    for pid in pids:
        subject = f"pid {pid}"
        socks, status = snap.fact(f"sockets.{pid}"), snap.fact(f"proc.{pid}.status")
        if not socks.ok or not status.ok:
            results.append(Result("unknown", subject=subject,
                                  reason=(socks.missing or status.missing or "")))
            continue
        n = socks.value["connections"]
        if n == 0:
            results.append(Result("skip", subject=subject,
                                  reason="the process holds no established TCP connection"))
            continue
        held = sum(m.get(k, 0) for m in socks.value["skmem"] for k in HELD) / n
        kernel = fixed + held
        bare = sum(1 for m in socks.value["skmem"] if not m)  # ss printed no skmem for them
        lacking = absent + ([f"skmem of {bare} of {n} sockets"] if bare else [])
        rss = status.value.get("rss_bytes")
        bound = rss / n + kernel if rss is not None else None
        limit = p["limit"]
        ev = {"connections": n, "kernel_fixed_bytes": fixed, "kernel_buffers_bytes_mean": round(held),
              "slab_object_sizes": slabs, "process_rss_bytes": rss,
              "upper_bound_bytes_per_connection": round(bound) if bound is not None else None}
        if kernel > limit:
            results.append(Result("fail", subject=subject, observed=round(kernel), evidence=ev,
                                  reason=f"the kernel alone holds {kernel:.0f} B per connection "
                                         f"over {n} connections"))
        elif lacking:
            ev["not_counted"] = lacking
            results.append(Result("unknown", subject=subject, observed=round(kernel), evidence=ev,
                                  reason=f"no size for {', '.join(lacking)} (absent from "
                                         "/proc/slabinfo or `ss -m`): the kernel share "
                                         f"({kernel:.0f} B per connection without them) is only a "
                                         "lower bound"))
        elif bound is not None and bound <= limit:
            results.append(Result("pass", subject=subject, observed=round(bound), evidence=ev,
                                  reason=f"at most {bound:.0f} B per connection (RSS and kernel, "
                                         f"{n} connections)"))
        else:
            results.append(Result("unknown", subject=subject, observed=round(kernel), evidence=ev,
                                  reason=f"kernel share {kernel:.0f} B per connection is within the "
                                         f"limit, but the process share is not separable: RSS / "
                                         f"connections gives only a bound of "
                                         f"{(bound or 0):.0f} B"))
    return results
