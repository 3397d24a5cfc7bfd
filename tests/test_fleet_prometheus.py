"""`tailgate serve` and `tailgate rules`: the metrics, the rules proven with promtool, and an
alert that fires in a real Prometheus on a real fault (issue 13)."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from support.cgroups import cpu_cgroup, set_quota
from tailgate.baseline import catalog, default_baseline
from tailgate.model import Finding, Report, Verdict
from tailgate.probes import loglin
from tailgate.report import prometheus as prom
from tailgate.rules import RuleOptions, alert_name, generate, to_yaml

TAILGATE = [sys.executable, "-m", "tailgate"]


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} not installed (Debian `prometheus`; make test installs it)")
    return path


def finding(cid: str, status: str, observed=None, subject: str = "host") -> Finding:
    e = catalog()[cid]
    return Finding(cid, e.layer, e.title, status, subject, observed, e.params.get("limit"),
                   e.unit, "", {}, e.remedy)


def a_report(*findings: Finding) -> Report:
    return Report("0", {}, {}, 1.0, 1234.5, Verdict("fail", "L2", {}), tuple(findings))


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


# -- the metrics, pure -----------------------------------------------------------------------

def test_status_is_a_state_set_and_values_are_in_base_units():
    from prometheus_client import CollectorRegistry, generate_latest

    rep = a_report(finding("l2.sched.runqlat", "fail", 812.5),
                   finding("l2.net.drop_rate", "pass", 0.001),
                   finding("l1.optics.rx_power", "unknown", float("nan"), "eth0"),
                   finding("l3.xps.per_core_tx", "warn", 1, "eth0"))
    limits = {cid: (e.params.get("limit"), e.unit) for cid, e in catalog().items()}

    class One:
        def collect(self):
            return prom.report_metrics(rep, limits)

    reg = CollectorRegistry()
    reg.register(One())
    fams = families(generate_latest(reg).decode())
    states = {(s.labels["id"], s.labels["status"]): s.value for s in fams["tailgate_finding_status"]}
    assert states[("l2.sched.runqlat", "fail")] == 1 and states[("l2.sched.runqlat", "pass")] == 0
    assert sum(v for (cid, _), v in states.items() if cid == "l1.optics.rx_power") == 1
    seconds = {s.labels["id"]: s.value for s in fams["tailgate_finding_observed_seconds"]}
    assert seconds == {"l2.sched.runqlat": pytest.approx(812.5e-6)}
    ratio = {s.labels["id"]: s.value for s in fams["tailgate_finding_observed_ratio"]}
    assert ratio == {"l2.net.drop_rate": pytest.approx(1e-5)}  # 0.001 % as a ratio
    # NaN is no observation: the series is absent, not NaN
    other = {s.labels["id"] for s in fams.get("tailgate_finding_observed", [])}
    assert "l1.optics.rx_power" not in other
    red = {s.labels["id"]: s.value for s in fams["tailgate_red_line_seconds"]}
    assert red["l2.sched.runqlat"] == pytest.approx(500e-6)
    failing = {s.labels["layer"]: s.value for s in fams["tailgate_layer_failing"]}
    assert failing == {"L1": 0, "L2": 1, "L3": 0, "L4": 0}


def test_every_bucket_bound_is_a_probe_bucket_bound():
    bounds = prom.histogram_bounds_ns()
    assert bounds == sorted(set(bounds))
    for b in bounds:
        low, _ = loglin.bucket_bounds(loglin.bucket_key(b))
        assert low == b, b


def prometheus_quantile(q: float, buckets: list[tuple[str, float]]) -> float:
    """Prometheus's histogram_quantile: linear interpolation inside the bucket of the rank."""
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == "+Inf":
                return prev_le
            return prev_le + (float(le) - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = float(le), c
    raise AssertionError


@pytest.mark.parametrize("seed", range(5))
def test_histogram_quantile_p999_within_a_few_percent_near_the_red_line(seed):
    rng = random.Random(seed)
    # a run queue with most waits of a few µs and a tail around the 500 µs red line
    samples = [int(rng.lognormvariate(math.log(4000), 1.2)) for _ in range(20000)]
    samples += [int(rng.uniform(150e3, 2e6)) for _ in range(100)]
    keyed: dict[int, int] = {}
    for s in samples:
        keyed[loglin.bucket_key(s)] = keyed.get(loglin.bucket_key(s), 0) + 1
    bounds = prom.histogram_bounds_ns()
    counts = [0] * (len(bounds) + 1)
    for key, c in keyed.items():
        low, high = loglin.bucket_bounds(key)
        counts[prom.bucket_index(bounds, high - 1)] += c
    le = prom.cumulative(counts, bounds)
    assert le[-1] == ("+Inf", len(samples))
    exact = loglin.exact_quantile(samples, 0.999) * 1e-9
    got = prometheus_quantile(0.999, le)
    assert abs(got - exact) / exact < 0.04, (got, exact)


def test_textfile_is_replaced_atomically(tmp_path):
    from tailgate.exporter import write_textfile

    write_textfile(str(tmp_path), "a 1\n")
    path = write_textfile(str(tmp_path), "tailgate_x 2\n")
    assert Path(path).read_text() == "tailgate_x 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tailgate.prom"]


# -- live: the exporter on this host ---------------------------------------------------------

def test_serve_once_measures_the_run_queue_with_the_resident_probe(tmp_path):
    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        pytest.fail("needs root and bpftrace (make test installs bpftrace; CI runs as root)")
    proc = subprocess.run([*TAILGATE, "serve", "--once", "--interval", "0.5", "--probe-window",
                           "1", "--textfile", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    fams = families((tmp_path / "tailgate.prom").read_text())
    up = fams["tailgate_probe_up"]
    assert [s.value for s in up] == [1.0], up
    hist = {s.name: s for s in fams["tailgate_runqueue_latency_seconds"] if s.name.endswith("_count")}
    assert hist["tailgate_runqueue_latency_seconds_count"].value > 0
    # its own cost (issue 46): the switches it timed (the histogram's count) x the measured
    # cost of one
    from tailgate.exporter import PROBE_COST_S

    (events,) = fams["tailgate_probe_events"]
    (per,) = fams["tailgate_probe_cost_seconds_per_event"]
    (spent,) = fams["tailgate_probe_cpu_seconds"]
    assert events.value == hist["tailgate_runqueue_latency_seconds_count"].value
    assert per.value == PROBE_COST_S["runqlat"] and per.labels == {"probe": "runqlat"}
    assert spent.value == pytest.approx(events.value * per.value)
    runq = [s for s in fams["tailgate_finding_status"]
            if s.labels["id"] == "l2.sched.runqlat" and s.value == 1]
    assert [s.labels["status"] for s in runq] in (["pass"], ["fail"]), runq


def test_serve_refuses_bad_arguments():
    for args, words in ((["--listen", "0.0.0.0"], "ADDRESS:PORT"),
                        (["--listen", "example.com:80"], "not an IP address"),
                        (["--probe", "offcpu"], "not a resident probe"),
                        (["--no-listen"], "needs --textfile")):
        proc = subprocess.run([*TAILGATE, "serve", *args], capture_output=True, text=True,
                              timeout=30, check=False)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)


# -- rules, proven with promtool -------------------------------------------------------------

def write_rules(tmp_path: Path, **opts) -> Path:
    path = tmp_path / "tailgate.rules.yml"
    path.write_text(to_yaml(generate(default_baseline(), RuleOptions(**opts))))
    return path


def test_generated_rules_pass_promtool_check(tmp_path):
    promtool = need("promtool")
    rules = write_rules(tmp_path)
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = yaml.safe_load(rules.read_text())
    alerts = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert {alert_name(cid) for cid in catalog()} <= alerts


def test_cli_rules_honour_the_baseline(tmp_path):
    base = tmp_path / "b.yaml"
    base.write_text("l2.sched.runqlat: 300\nl1.clock.ptp: {enabled: false}\n")
    out = subprocess.run([*TAILGATE, "rules", "--baseline", str(base), "--for", "1m"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    doc = yaml.safe_load(out)
    rules = {r.get("alert"): r for g in doc["groups"] for r in g["rules"]}
    assert "TailgateL1ClockPtp" not in rules
    assert rules["TailgateRunqueueP999High"]["expr"].endswith("> 0.0003")
    assert rules["TailgateL2SchedRunqlat"]["for"] == "1m"
    bad = subprocess.run([*TAILGATE, "rules", "--for", "five minutes"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "Prometheus duration" in bad.stderr


def test_rules_fire_exactly_when_the_red_line_is_crossed(tmp_path):
    """promtool's rule unit tests: every id's alert fires for a failing series and stays
    silent for a passing one; the run-queue P999 rule fires above 500 µs and not below."""
    promtool = need("promtool")
    rules = write_rules(tmp_path, for_fail="2m", window="1m")
    by_name = {r["alert"]: r for g in yaml.safe_load(rules.read_text())["groups"]
               for r in g["rules"] if "alert" in r}

    def annotations(name: str, **values: str) -> dict[str, str]:
        out = {}
        for k, v in by_name[name]["annotations"].items():
            for var, val in values.items():
                v = v.replace("{{ " + var + " }}", val)
            out[k] = v
        return out

    series, alerts = [], []
    for cid, e in catalog().items():
        for inst, status in (("bad", "fail"), ("good", "pass")):
            for s in ("pass", "fail"):
                series.append({
                    "series": f'tailgate_finding_status{{instance="{inst}",id="{cid}",'
                              f'layer="{e.layer}",subject="host",status="{s}"}}',
                    "values": f"{1 if s == status else 0}x10"})
        alerts.append({"eval_time": "5m", "alertname": alert_name(cid), "exp_alerts": [{
            "exp_labels": {"severity": "critical", "layer": e.layer, "id": cid,
                           "instance": "bad", "subject": "host", "status": "fail"},
            "exp_annotations": annotations(alert_name(cid), **{"$labels.instance": "bad",
                                                                "$labels.subject": "host"})}]})
        alerts.append({"eval_time": "1m", "alertname": alert_name(cid), "exp_alerts": []})
    # run-queue histogram: per minute 10000 waits; on "slow" 20 of them (0.2 %) at ~2 ms
    bounds = prom.histogram_bounds_ns()
    for inst, slow in (("slow", 20), ("fast", 0)):
        counts = [0] * (len(bounds) + 1)
        counts[prom.bucket_index(bounds, 8000)] = 10000 - slow
        counts[prom.bucket_index(bounds, 2_000_000)] = slow
        for le, c in prom.cumulative(counts, bounds):
            series.append({"series": f'tailgate_runqueue_latency_seconds_bucket{{instance='
                                     f'"{inst}",job="node",le="{le}"}}',
                           "values": f"0+{c:g}x10"})
    alerts.append({"eval_time": "6m", "alertname": "TailgateRunqueueP999High", "exp_alerts": [{
        "exp_labels": {"severity": "critical", "layer": "L2", "id": "l2.sched.runqlat",
                       "instance": "slow", "job": "node"},
        # the P999 promtool computes from the exported buckets: the 2 ms waits, within 0.1 %
        "exp_annotations": annotations("TailgateRunqueueP999High", **{
            "$labels.instance": "slow", "$value | humanizeDuration": "1.999ms"})}]})
    test = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "alert_rule_test": alerts}]}
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "SUCCESS" in out.stdout


# -- end to end: a real Prometheus, a real fault ---------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
        return json.load(r)


def wait_for(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def test_throttling_alert_fires_in_prometheus_and_resolves(tmp_path):
    prometheus = need("prometheus")
    procs: list[subprocess.Popen] = []
    with cpu_cgroup(quota_us=10000) as cg:  # the fault: 10 % of a CPU
        try:
            busy = subprocess.Popen(["sh", "-c", "end=$(($(date +%s)+120)); "
                                     "while [ $(date +%s) -lt $end ]; do :; done"])
            procs.append(busy)
            (cg / "cgroup.procs").write_text(str(busy.pid))
            port, prom_port = free_port(), free_port()
            serve = subprocess.Popen([*TAILGATE, "serve", "--listen", f"127.0.0.1:{port}",
                                      "--interval", "1", "--probe", "", "--cgroup", str(cg)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            procs.append(serve)
            rules = write_rules(tmp_path, for_fail="2s")
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [{"job_name": "tailgate",
                                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
            server = subprocess.Popen(
                [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(server)
            api = f"http://127.0.0.1:{prom_port}/api/v1/alerts"

            def state() -> str | None:
                try:
                    alerts = get_json(api)["data"]["alerts"]
                except OSError:
                    return None
                found = [a["state"] for a in alerts
                         if a["labels"]["alertname"] == "TailgateL2CgroupThrottling"]
                return found[0] if found else "inactive"

            assert wait_for(lambda: state() == "firing", 60, "the throttling alert to fire")
            set_quota(cg, None)  # the fault removed (cpu.cfs_quota_us -1 / cpu.max "max")
            wait_for(lambda: state() == "inactive", 60, "the alert to resolve")
        finally:
            for p in reversed(procs):
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def test_a_probe_that_cannot_run_is_a_series_not_a_crash(tmp_path):
    # No bpftrace on PATH: the probe is down, with the reason, and the findings still come.
    env = {**os.environ, "PATH": str(tmp_path)}
    proc = subprocess.run([*TAILGATE, "serve", "--once", "--interval", "0.2", "--probe-window",
                           "1"], capture_output=True, text=True, timeout=120, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    fams = families(proc.stdout)
    (up,) = fams["tailgate_probe_up"]
    assert up.value == 0 and "bpftrace" in up.labels["reason"], up
    failed = [s for s in fams["tailgate_probe_windows"] if s.labels["outcome"] == "failed"]
    assert failed[0].value == 1
    runq = [s.labels["status"] for s in fams["tailgate_finding_status"]
            if s.labels["id"] == "l2.sched.runqlat" and s.value == 1]
    assert runq == ["unknown"]


def test_a_rate_finding_exports_the_window_of_the_counter_history():
    """The counter history's rates: FEC blocks per hour judged over the window since the last
    stored run (real `ethtool -I --show-fec` capture) export that window beside the rate."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tailgate.sources.ethtool import parse_fec
    from test_l1_checks import fec_facts, fixture, judge, snap

    now = parse_fec(fixture("ethtool-I-show-fec.txt", skip=1))
    then = {**now, "stats": {**now["stats"], "uncorrectable_blocks": {"total": 100, "lanes": {}}}}
    hourly = judge("l1.fec.uncorrectable", snap(fec_facts(now), before=fec_facts(now), interval=5.0,
                                                earlier={"ethtool.fec.eth2": then},
                                                earlier_at=1005.0 - 3600.0))
    first_run = judge("l1.fec.uncorrectable", snap(fec_facts(now), before=fec_facts(now),
                                                   interval=5.0))
    rep = a_report(*hourly, *first_run, finding("l2.sched.runqlat", "pass", 100.0))

    class One:
        def collect(self):
            return prom.report_metrics(rep, {})

    reg = CollectorRegistry()
    reg.register(One())
    fams = families(generate_latest(reg).decode())
    windows = sorted((s.labels["source"], s.value) for s in fams["tailgate_finding_rate_window_seconds"])
    assert windows == [("history", 3600.0), ("interval", 5.0)]
    rates = [s.value for s in fams["tailgate_finding_observed"] if s.labels["id"] == "l1.fec.uncorrectable"]
    assert sorted(rates) == [0.0, 45.0]
