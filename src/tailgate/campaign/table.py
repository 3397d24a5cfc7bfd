"""The method's table: two campaign directories in, one row per metric out, bottom-up (pure
but for reading the documents, which it checks against the index's digests).

Rows come from the members' own documents, through :mod:`tailgate.compare` (its extraction,
its order-statistic intervals and its gate), so a campaign's row reads as `compare` reads
the same document alone:

* L1-L4 from the inspect report (every finding with a measured value, named ``ID [SUBJECT]``);
  the run-queue P999 gets its interval from the probe's log-linear buckets in the snapshot;
* end to end: each load's latency P50/P99/P999 (interval from its histogram), goodput (OK
  responses per second) and error rate; an ``openai+`` load's TTFT, ITL and decode tokens/s
  are L4 rows, its request latency end-to-end;
* collectives: per size, time per iteration P50/P999 (interval from its histogram) and bus
  bandwidth.

A figure without a histogram has no noise model: its significance is ``n/a``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..compare import (
    Metric,
    Row,
    compare,
    extract,
    hist_interval,
    rank_interval,
    status_changes,
)
from ..errors import InputError
from ..hist import Histogram, decode
from .run import INDEX, SCHEMA, digest

# a short name per check id, for the table's "what" column (the catalog title is a red line)
LABELS = {
    "l1.fec.uncorrectable": "FEC uncorrectable blocks", "l1.optics.rx_power": "optics RX power",
    "l1.pcie.bad_tlp": "PCIe error counters (bad TLP)",
    "l1.pcie.link_recovery": "PCIe link recoveries", "l1.clock.ptp": "clock offset",
    "l2.sched.runqlat": "run-queue P999", "l2.cgroup.throttling": "CFS throttling",
    "l2.net.drop_rate": "drops", "l2.net.retransmit_rate": "retransmits",
    "l2.net.syscall_batching": "packets per syscall", "l3.dpdk.packet_rate": "packet rate",
    "l3.dpdk.rx_overflow": "ring drops (RX overflow)",
    "l3.dpdk.mbuf_exhaustion": "mbuf allocation failures",
    "l3.alloc.hot_path": "allocations on the hot path", "l3.conn.memory": "memory per connection",
    "l4.prefix_cache.hit_rate": "prefix-cache hit rate",
    "l4.memory.fragmentation": "GPU memory fragmentation",
    "l4.specdec.acceptance": "speculative acceptance",
}
BENCH_KEEP = ("latency.p50", "latency.p99", "latency.p999", "rate.achieved", "error_rate",
              "packet_rate", "packet_loss", "cpu_per_packet")  # the last three: udp:// loads
# a load's datagram rows (NAME packet_rate ...), named as the method's table names them
LOAD_LABELS = {"packet_rate": "packet rate", "packet_loss": "datagram loss",
               "cpu_per_packet": "CPU per datagram"}
LLM_KEEP = ("ttft.p50", "ttft.p99", "ttft.p999", "itl.p50", "itl.p99", "itl.p999",
            "e2e.p50", "e2e.p99", "e2e.p999", "output_tokens_per_s", "goodput_rps",
            # the engine's own phases (llama-server's per-request timings), where it sent them
            "engine_queue.p50", "engine_queue.p99", "engine_held.p50", "engine_held.p99",
            "engine_prefill.p50", "engine_prefill.p99",
            "engine_decode.p50", "engine_decode.p99")


class CampaignFileError(InputError):
    """A campaign directory that cannot be read (the message names the file)."""


@dataclass(frozen=True)
class CampaignDir:
    path: str
    index: dict[str, Any]
    docs: dict[str, dict[str, Any]]  # member file -> its document (JSON members only)

    def step_doc(self, step: dict[str, Any]) -> dict[str, Any] | None:
        for m in step.get("members") or []:
            if m["file"] in self.docs and not m["file"].startswith("snapshot"):
                return self.docs[m["file"]]
        return None

    @property
    def steps(self) -> list[dict[str, Any]]:
        return list(self.index.get("steps") or [])


def is_campaign_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, INDEX))


def load_dir(path: str) -> CampaignDir:
    """A campaign directory: its index and every JSON member, each checked against its digest
    (a member changed after the run is refused, never silently compared)."""
    from ..userfiles import UserFileError, load_json

    ipath = os.path.join(path, INDEX)
    if not os.path.isdir(path):
        raise CampaignFileError(f"{path}: not a directory")
    try:
        index = load_json(ipath)
    except UserFileError as exc:
        raise CampaignFileError(f"{exc} (not a campaign directory?)") from exc
    if not isinstance(index, dict) or index.get("tailgate_campaign") != SCHEMA:
        raise CampaignFileError(f"{ipath}: not a tailgate campaign index (tailgate_campaign: "
                                f"{SCHEMA})")
    docs: dict[str, dict[str, Any]] = {}
    for step in index.get("steps") or []:
        for m in step.get("members") or []:
            f = str(m.get("file", ""))
            if os.path.basename(f) != f or not f:
                raise CampaignFileError(f"{ipath}: member {f!r}: not a file of the directory")
            full = os.path.join(path, f)
            if not os.path.isfile(full):
                raise CampaignFileError(f"{full}: listed in the index, missing")
            if digest(full) != m.get("sha256"):
                raise CampaignFileError(f"{full}: sha256 differs from the index's (changed "
                                        "after the run)")
            if f.endswith(".json"):
                try:
                    doc = load_json(full)
                except UserFileError as exc:
                    raise CampaignFileError(str(exc)) from exc
                if isinstance(doc, dict):
                    docs[f] = doc
    return CampaignDir(path, index, docs)


# -- one side's metrics -----------------------------------------------------------------------

def _service_subject(subject: str, pids: list[int]) -> str:
    """``pid 4711`` of the campaign's service -> ``service[0]``: the same process slot matches
    across two campaigns although its pid changed."""
    if subject.startswith("pid "):
        try:
            return f"service[{pids.index(int(subject[4:]))}]"
        except ValueError:
            return subject
    return subject


def _runqlat_ci(snapshot: dict[str, Any] | None, subject: str) -> tuple[tuple[float, float],
                                                                         int] | None:
    """The P999 interval (us) of the probe's log-linear buckets behind one runqlat finding."""
    from ..probes import loglin

    fact = ((snapshot or {}).get("facts") or {}).get("probe.runqlat") or {}
    s = fact.get("value")
    if not isinstance(s, dict):
        return None
    if subject.startswith("pid "):
        s = (s.get("processes") or {}).get(subject[4:])
        if not isinstance(s, dict):
            return None
    keyed: dict[int, int] = {}
    try:
        for b in s.get("buckets") or []:
            k = loglin.bucket_key(round(float(b["min"]) * 1000))
            keyed[k] = keyed.get(k, 0) + int(b["count"])
    except (KeyError, TypeError, ValueError):
        return None
    n = sum(keyed.values())
    if n < 2:
        return None
    lo, hi = rank_interval(n, 0.999)
    return (loglin.quantile(keyed, lo / n) / 1e3, loglin.quantile(keyed, hi / n) / 1e3), n


def _inspect_metrics(doc: dict[str, Any], snapshot: dict[str, Any] | None,
                     pids: list[int]) -> list[Metric]:
    _, rows = extract(doc)
    subjects = {f"{f['id']} [{f.get('subject', 'host')}]": f for f in doc["findings"]}
    out = []
    for m, _ in rows:
        f = subjects.get(m.name)
        if f is None:
            continue
        subject = f.get("subject", "host")
        if f["id"] == "l2.sched.runqlat":
            got = _runqlat_ci(snapshot, subject)
            if got:
                m.ci, m.count = got
        m.name = f"{f['id']} [{_service_subject(subject, pids)}]"
        out.append(m)
    return out


def _load_metrics(name: str, doc: dict[str, Any]) -> list[tuple[Metric, Histogram | None]]:
    k, rows = extract(doc)
    keep = LLM_KEEP if k == "llm" else BENCH_KEEP
    out = []
    for m, h in rows:
        if m.name not in keep:
            continue
        if k == "llm" and m.name.startswith("e2e."):
            m.layer = "end-to-end"
        if m.name == "output_tokens_per_s":
            m.name = "decode_tokens_per_s"
        m.name = f"{name} {m.name}"
        out.append((m, h))
    if k == "bench":
        ok = (doc.get("rate") or {}).get("ok")
        if isinstance(ok, (int, float)) and not isinstance(ok, bool):
            out.append((Metric(f"{name} goodput", "end-to-end", "req/s", float(ok), "higher"),
                        None))
    return out


def _size(n: int) -> str:
    from ..bench.collective.spec import format_size

    return format_size(n)


def _collective_metrics(doc: dict[str, Any]) -> list[tuple[Metric, Histogram | None]]:
    out: list[tuple[Metric, Histogram | None]] = []
    coll = str(doc.get("collective") or "allreduce")
    for block in doc.get("sizes") or []:
        where = f"{coll} {_size(int(block['bytes']))}"
        if block.get("placement") == "in_place":
            where += " in-place"
        lat = block.get("latency_ms") or {}
        h = decode(block["histogram_ns"]) if block.get("histogram_ns") else None
        for stat, pct in (("p50", 50.0), ("p999", 99.9)):
            if lat.get(stat) is None:
                continue
            m = Metric(f"{where} time.{stat}", "collective", "ms", float(lat[stat]),
                       count=lat.get("count"))
            if h is not None:
                ci = hist_interval(h, pct)
                m.ci = (ci[0] / 1e6, ci[1] / 1e6) if ci else None
                m.count = h.total
            out.append((m, h))
        if block.get("busbw_gbps") is not None:
            out.append((Metric(f"{where} busbw", "collective", "GB/s",
                               float(block["busbw_gbps"]), "higher"), None))
    return out


@dataclass(frozen=True)
class Side:
    metrics: list[Metric]
    spectra: dict[str, tuple[Histogram, str]]  # name -> (histogram ns, unit label)
    inspect: dict[str, Any] | None
    slos: dict[tuple[str, str], bool]  # (load, expr) -> pass
    steps: dict[str, str]  # step name -> status


def one_side(camp: CampaignDir) -> Side:
    """Every figure of one campaign, from its documents."""
    pids = [int(p) for p in (camp.index.get("service") or {}).get("pids") or []]
    metrics: list[Metric] = []
    spectra: dict[str, tuple[Histogram, str]] = {}
    inspect_doc = None
    slos: dict[tuple[str, str], bool] = {}
    steps: dict[str, str] = {}
    for step in camp.steps:
        steps[step["name"]] = step["status"]
        doc = camp.step_doc(step)
        if doc is None:
            continue
        try:
            if step["kind"] == "inspect" and "findings" in doc:
                inspect_doc = doc
                snap = next((camp.docs[m["file"]] for m in step["members"]
                             if m["file"] == "snapshot.json" and m["file"] in camp.docs), None)
                metrics += _inspect_metrics(doc, snap, pids)
            elif step["kind"] == "bench":
                name = step["name"].removeprefix("load ")
                got = _load_metrics(name, doc)
                metrics += [m for m, _ in got]
                for m, h in got:
                    if h is not None and m.name.endswith((" latency.p50", " ttft.p50")):
                        spectra[m.name.rsplit(".", 1)[0]] = (h, "ms")
                for s in doc.get("slo") or []:
                    slos[(name, str(s.get("expr")))] = bool(s.get("pass"))
            elif step["kind"] == "collective":
                got = _collective_metrics(doc)
                metrics += [m for m, _ in got]
                for m, h in got:
                    if h is not None and m.name.endswith("time.p50"):
                        spectra[m.name.rsplit(".", 1)[0]] = (h, "ms")
        except (KeyError, TypeError, ValueError) as exc:
            member = step["members"][0]["file"]
            raise CampaignFileError(f"{os.path.join(camp.path, member)}: {exc}") from exc
    return Side(metrics, spectra, inspect_doc, slos, steps)


# -- two sides --------------------------------------------------------------------------------

def changes(before: Side, after: Side) -> list[dict[str, str]]:
    """What changed status, bottom-up: findings, then each load's SLOs, then the steps."""
    out = []
    if before.inspect and after.inspect:
        out += status_changes(before.inspect, after.inspect)
    for key, passed in after.slos.items():
        if key in before.slos and before.slos[key] != passed:
            out.append({"id": f"slo {key[1]}", "subject": key[0], "layer": "end-to-end",
                        "before": "pass" if before.slos[key] else "fail",
                        "after": "pass" if passed else "fail", "reason": ""})
    for name, status in after.steps.items():
        if name in before.steps and before.steps[name] != status:
            out.append({"id": "step", "subject": name, "layer": "campaign",
                        "before": before.steps[name], "after": status, "reason": ""})
    return out


def table(before: Side, after: Side) -> tuple[list[Row], list[str], list[str]]:
    """The rows both sides have (bottom-up), and the metric names only one side has."""
    rows = compare(before.metrics, after.metrics)
    names_b = {m.name for m in before.metrics}
    names_a = {m.name for m in after.metrics}
    return rows, sorted(names_b - names_a), sorted(names_a - names_b)


def label(name: str) -> str:
    """The "what" of a row: the short name of its check, or the metric itself."""
    cid = name.split(" [", 1)[0]
    return LABELS.get(cid) or LOAD_LABELS.get(name.rsplit(" ", 1)[-1], "")


def summary(camp: CampaignDir) -> dict[str, Any]:
    i = camp.index
    return {"dir": camp.path, "name": i.get("name"), "started": i.get("started"),
            "finished": i.get("finished"), "hosts": i.get("hosts"), "tailgate": i.get("tailgate"),
            "steps": [{"name": s["name"], "status": s["status"], "reason": s.get("reason", ""),
                       "duration_s": s.get("duration_s")} for s in camp.steps]}
