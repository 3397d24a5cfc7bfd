"""Attribution: which evidence co-occurs with the slow requests, and how strongly (pure).

A request is the interval from its intended start to its end (the latency the user saw). A
cause is a set of intervals on the same clock (run-queue waits, throttled periods, stops,
futex waits) or instants (TCP retransmissions). For the requests above the P99 (and P999) we
count how many were in flight during the cause, and compare with all requests: a cause is
claimed when it covers a large share of the tail (``min_cover``) and markedly more of the tail
than of the requests at large (``min_lift``) — co-occurrence that is everywhere explains
nothing. When no cause passes, the report says the tail is unexplained.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..spans import overlap_ns, touched

MIN_TAIL = 10  # fewer requests above the P99 than this: too few to attribute
PERVASIVE_SHARE = 0.5


@dataclass(frozen=True)
class Cause:
    key: str
    layer: str
    what: str  # "the server's threads waited >= 0.2 ms in the run queue"
    remedy: str
    check_id: str | None = None


@dataclass
class Attribution:
    cause: Cause
    tail_cover: float  # share of requests above the P99 in flight during the cause
    time_share: float  # mean share of those requests' latency spent during the cause
    tail999_cover: float | None
    all_cover: float
    lift: float
    events: int
    total_ms: float
    claimed: bool
    sentence: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"cause": self.cause.key, "layer": self.cause.layer, "check_id": self.cause.check_id,
                "claimed": self.claimed, "tail_p99_cover": round(self.tail_cover, 4),
                "tail_time_share": round(self.time_share, 4),
                "tail_p999_cover": (None if self.tail999_cover is None
                                    else round(self.tail999_cover, 4)),
                "all_cover": round(self.all_cover, 4), "lift": round(self.lift, 3),
                "events": self.events, "total_ms": round(self.total_ms, 3),
                "sentence": self.sentence, "remedy": self.cause.remedy, **self.extra}


@dataclass(frozen=True)
class Owned:
    """Evidence already set against each request (diagnose.chain.owned): whether any of it
    overlapped the request's window (``hit``) and for how long (``inside``, ns), counting for
    each request only the threads it belongs to. ``spans``: the union of what was counted
    (events and total time); ``threads``: how many threads' evidence was counted."""

    hit: np.ndarray
    inside: np.ndarray
    spans: np.ndarray
    threads: int = 0


GENERATOR = Cause("generator", "load", "the load generator itself sent them late or read "
                  "their replies late (its own lateness, not the service)",
                  "Give the generator more cores (--workers) or a lower --rate; its lateness "
                  "is in the bench result.")


def _score(cause: Cause, spans: np.ndarray | Owned, starts: np.ndarray, ends: np.ndarray,
           tail: np.ndarray, tail999: np.ndarray, level: str, cut: float,
           crit: dict[str, float]) -> Attribution:
    """How strongly ``spans`` co-occur with the requests of ``tail`` (those above ``level``);
    :class:`Owned` evidence counts for each request only where it belongs to it."""
    lat = ends - starts
    own = spans if isinstance(spans, Owned) else None
    if own is not None:
        hit, spans = own.hit, own.spans
    else:
        hit = touched(starts, ends, spans)
    n_tail = int(tail.sum())
    tail_cover = float(hit[tail].mean()) if n_tail else 0.0
    all_cover = float(hit.mean())
    lift = tail_cover / all_cover if all_cover > 0 else (float("inf") if tail_cover else 0.0)
    total = float((spans[:, 1] - spans[:, 0]).sum()) / 1e6 if len(spans) else 0.0
    if total > 0 and n_tail:
        inside = (own.inside[tail] if own is not None
                  else overlap_ns(starts[tail], ends[tail], spans))
        share = float((inside / np.maximum(lat[tail], 1)).mean())
        mean_ms = float(inside.mean()) / 1e6
    else:  # instants (retransmissions): the request waited for the whole recovery
        share = tail_cover
        mean_ms = float(lat[tail].mean()) / 1e6 * tail_cover if n_tail else 0.0
    # Markedly more of the tail than of the rest; or, a cause that is everywhere (a
    # saturating one), when it lasted most of the tail's latency. Never for evidence shorter
    # than min_ms per slow request: noise a healthy host always has.
    claimed = (n_tail >= MIN_TAIL and tail_cover >= crit["min_cover"]
               and share >= crit["min_share"] and mean_ms >= crit["min_ms"]
               and (lift >= crit["min_lift"] or share >= PERVASIVE_SHARE))
    a = Attribution(cause, tail_cover, share,
                    float(hit[tail999].mean()) if tail999.any() else None,
                    all_cover, lift, len(spans), total, claimed)
    a.extra["tail"] = level
    a.sentence = (f"{100 * tail_cover:.0f} % of the {n_tail} requests above the {level} "
                  f"({cut / 1e6:.3f} ms) were in flight while {cause.what} "
                  f"(vs {100 * all_cover:.0f} % of all {len(lat)} requests; {len(spans)} events, "
                  f"{total:.1f} ms in all)" + (f"; it lasted {100 * share:.0f} % of their "
                                               f"latency, {mean_ms:.2f} ms each"
                                               if total > 0 else ""))
    return a


def attribute(starts: np.ndarray, ends: np.ndarray, causes: dict[Cause, np.ndarray | Owned],
              min_cover: float = 0.5, min_lift: float = 1.5, min_share: float = 0.1,
              sends: np.ndarray | None = None, min_ms: float = 1.0
              ) -> tuple[list[Attribution], dict]:
    """Rank causes for the requests ``[starts, ends]`` (ns). Returns the attributions (claimed
    first: a late generator, then bottom-up by layer, then by the share of the tail's latency
    they lasted) and the tail facts. Each cause is judged on the requests above the P99; one
    that does not explain those is judged again on the requests above the P90 (a second cause
    hidden under a larger one). ``sends``: when the generator dispatched each request (0:
    never), so that the generator's own lateness is told apart from the service."""
    lat = ends - starts
    n = len(lat)
    info: dict[str, Any] = {"requests": n}
    if n == 0:
        info["unexplained"] = "no completed requests"
        return [], info
    p90, p99, p999 = (float(np.percentile(lat, q, method="inverted_cdf")) for q in (90, 99, 99.9))
    tail, tail90, tail999 = lat >= p99, lat >= p90, lat >= p999
    info.update(p90_ms=p90 / 1e6, p99_ms=p99 / 1e6, p999_ms=p999 / 1e6,
                tail_p99=int(tail.sum()), tail_p999=int(tail999.sum()))
    crit = {"min_cover": min_cover, "min_lift": min_lift, "min_share": min_share,
            "min_ms": min_ms}
    out = []
    for cause, spans in causes.items():
        a = _score(cause, spans, starts, ends, tail, tail999, "P99", p99, crit)
        if not a.claimed:
            b = _score(cause, spans, starts, ends, tail90, tail999, "P90", p90, crit)
            if b.claimed:
                a = b
        out.append(a)
    if sends is not None:
        out.append(_generator(starts, ends, sends, tail, p99, min_share, min_ms))
    # a late generator first (then the figures say nothing of the service), then bottom-up
    order = {layer: i for i, layer in enumerate(("load", "L1", "L2", "L3", "L4"))}
    # inside a layer, the cause that lasted most of the tail requests' time first
    out.sort(key=lambda a: (not a.claimed, a.extra.get("tail") == "P90",
                            order.get(a.cause.layer, 9), -a.time_share, -a.tail_cover))
    if int(tail.sum()) < MIN_TAIL:
        few = (f"only {int(tail.sum())} requests above the P99: too few to attribute (run "
               "longer or faster)")
        if any(a.claimed for a in out):  # a cause of the P90 was still named
            info["note"] = few + "; causes are judged on the requests above the P90"
        else:
            info["unexplained"] = few
    elif not any(a.claimed for a in out):
        info["unexplained"] = ("no evidence co-occurs with the tail more than with the rest of "
                               "the requests: the cause is not in what was measured")
    return out, info


def _generator(starts: np.ndarray, ends: np.ndarray, sends: np.ndarray, tail: np.ndarray,
               p99: float, min_share: float, min_ms: float = 1.0) -> Attribution:
    """The generator's own lateness in the tail's latency: intended start -> dispatch
    (waiting for a free connection is the service's doing, not the generator's). Its
    reading is in no latency where the kernel's receive stamp ends it (the compiled
    engine); elsewhere it is in the service's part, unseen. When the lateness dominates, the
    tail says nothing about the service. Like any cause,
    it is claimed only when it lasted ``min_ms`` a slow request: a VM's timed or woken
    wake-up is 25-300 us late on a quiet host, which is half of a 0.1 ms tail, and a run
    that fast has no tail to explain."""
    lat = np.maximum(ends - starts, 1)
    late = np.minimum(np.clip(np.where(sends > 0, sends - starts, 0), 0, None), lat)
    share = float((late[tail] / lat[tail]).mean()) if tail.any() else 0.0
    cover = float((late[tail] >= 0.5 * lat[tail]).mean()) if tail.any() else 0.0
    everywhere = float((late >= 0.5 * lat).mean())
    mean_ms = float(late[tail].mean()) / 1e6 if tail.any() else 0.0
    a = Attribution(GENERATOR, cover, share, None, everywhere,
                    cover / everywhere if everywhere else (float("inf") if cover else 0.0),
                    int(tail.sum()), float(late[tail].sum()) / 1e6,
                    claimed=bool(tail.sum() >= MIN_TAIL and share >= max(min_share, 0.5)
                                 and mean_ms >= min_ms))
    a.extra["tail"] = "P99"
    a.sentence = (f"{100 * cover:.0f} % of the {int(tail.sum())} requests above the P99 "
                  f"({p99 / 1e6:.3f} ms) spent most of their latency waiting for the load "
                  f"generator to send them; its lateness lasted "
                  f"{100 * share:.0f} % of their latency"
                  + (f", {mean_ms:.3f} ms each: under the {min_ms:g} ms a claim needs"
                     if share >= 0.5 and mean_ms < min_ms else ""))
    return a


def part_share(starts: np.ndarray, ends: np.ndarray, q: float, spans: np.ndarray,
               part: np.ndarray) -> float | None:
    """Of the time ``spans`` overlapped the requests above the ``q`` percentile, the share
    that ``part`` (a subset of the spans) covers; None when the spans never met them. Used to
    say what kind of run-queue wait the tail saw: after a preemption (the service's threads
    used up their slice: involuntary context switches) or after a wake-up."""
    lat = ends - starts
    if not len(lat):
        return None
    tail = lat >= np.percentile(lat, q, method="inverted_cdf")
    whole = overlap_ns(starts[tail], ends[tail], spans).sum()
    if whole <= 0:
        return None
    return float(overlap_ns(starts[tail], ends[tail], part).sum() / whole)
