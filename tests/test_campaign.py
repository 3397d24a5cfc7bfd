"""Campaigns (issue 26): the campaign file's bad input, `campaign run` end to end against a
real nginx (a failing step recorded, the campaign going on), and `compare DIR DIR` on a
before with a real CPU quota and busy loops on the service's CPU and an after without."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.inspect import gate_code
from support.nginx import Nginx, available
from support.require import require
from tailgate.campaign.spec import CampaignError, parse_campaign

TAILGATE = [sys.executable, "-m", "tailgate"]


def tailgate(*args: str, timeout: float = 300, cpu: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    pre = ["taskset", "-c", cpu] if cpu else []
    return subprocess.run([*pre, *TAILGATE, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


# -- the campaign file ------------------------------------------------------------------------

BAD = [  # (text, line, words the one-line error holds)
    ("nme: x\n", 1, "key nme: unknown key"),
    ("loads:\n  - url: http://127.0.0.1:1/\n    rat: 5\n    duration: 1s\n", 3,
     "key rat: unknown key"),
    ("loads:\n  - url: http://127.0.0.1:1/\n    rate: fast\n    duration: 1s\n", 3,
     "key rate"),
    ("loads:\n  - url: http://127.0.0.1:1/\n    rate: 10\n", 2, "no `duration:` key"),
    ("loads:\n  - url: http://127.0.0.1:1/\n    duration: 1s\n    slo: [\"p99<<5ms\"]\n", 4,
     "key slo"),
    ("loads:\n  - {url: 'http://a:1/', duration: 1s}\n  - {url: 'http://a:1/', duration: 1s}\n",
     3, "is used twice"),
    ("loads: []\n", 1, "key loads: expected a non-empty list"),
    ("inspect:\n  probe_window: 0\n", 2, "key inspect.probe_window: expected seconds"),
    ("inspect:\n  interval: -1\n", 2, "key inspect.interval"),
    ("inspect:\n  baseline: nowhere.yaml\n", 2, "key inspect.baseline: no such file"),
    ("inspect:\n  dpdk: ['../x']\n", 2, "invalid DPDK file prefix"),
    ("service:\n  pids: [abc]\n", 2, "key service.pids: invalid pid"),
    ("diagnose: true\n", 1, "key diagnose: needs the service"),
    ("service:\n  pids: [1]\nray: auto\n", 3, "key ray: pids names one host's things"),
    ("collective: --backend nope\n", 1, "key collective: argument --backend"),
    ("collective: --iters 10 --json x.json\n", 1, "--json: the campaign writes"),
    ("timeout: 1 minute\n", 1, "key timeout"),
    ("inspect: {during: web}\n", 1, "key inspect.during: no load named 'web'"),
    ("inspect: {interval: 5, during: a}\nloads: [{name: a, url: 'http://a/', duration: 6s}]\n",
     1, "lasts 6 s, less than"),
    ("collective: nolauncher -np 2 tailgate bench allreduce\n", 1, "launcher 'nolauncher'"),
    ("loads:\n  - url: http://a/\n   duration: 1s\n", 3, "malformed YAML"),
]


@pytest.mark.parametrize("text,line,words", BAD)
def test_bad_campaign_files_name_file_line_and_key(tmp_path, text, line, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(CampaignError) as err:
        parse_campaign(text, str(path))
    assert str(err.value).startswith(f"{path}:{line}:"), err.value
    assert words in str(err.value)
    out = tailgate("campaign", "run", str(path), "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_baselines_own_error_names_the_baseline(tmp_path):
    (tmp_path / "b.yaml").write_text("l2.sched.runqlat: {limt: 3}\n")
    text = "inspect:\n  baseline: b.yaml\n"
    with pytest.raises(Exception) as err:
        parse_campaign(text, str(tmp_path / "c.yaml"))
    assert f"{tmp_path / 'b.yaml'}:1: key l2.sched.runqlat.limt" in str(err.value)


def test_run_refuses_a_missing_service_and_a_used_directory(tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text("service:\n  pids: [4194303]\n")
    out = tailgate("campaign", "run", str(c), "--out", str(tmp_path / "o"))
    assert out.returncode == 2 and f"{c}:2: key pids" in out.stderr, out.stderr
    c.write_text("inspect: {interval: 0}\n")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    out = tailgate("campaign", "run", str(c), "--out", str(tmp_path / "used"))
    assert out.returncode == 2 and "is not empty" in out.stderr, out.stderr


def test_a_good_file_parses_to_its_values(tmp_path):
    text = ("name: web\nservice: {pids: [1], iface: lo}\ninspect: {interval: 2s, "
            "probe_window: 3}\nloads:\n  - {name: a, url: 'openai+http://127.0.0.1:1/v1', "
            "requests: 4, model: m}\n  - {url: 'http://127.0.0.1:1/', rate: 5, duration: 1s, "
            "slo: p99<5ms}\ncollective: mpirun -np 2 tailgate bench allreduce --iters 5\n"
            "timeout: 2m\n")
    c = parse_campaign(text, str(tmp_path / "c.yaml"))
    assert (c.name, c.pids, c.ifaces, c.interval_s, c.probe_window_s) == ("web", (1,), ("lo",),
                                                                          2.0, 3.0)
    assert [x.name for x in c.loads] == ["a", "http://127.0.0.1:1/"]
    assert c.loads[1].options["slo"] == ["p99<5ms"]
    assert c.collective == ("--iters", "5") and c.timeout_s == 120.0
    assert (c.launcher, c.launcher_runs_module) == (("mpirun", "-np", "2"), False)
    c = parse_campaign("collective: python3 -m torch.distributed.run --nproc-per-node 2 -m "
                       "tailgate bench allreduce --backend gloo\n", "c.yaml")
    launcher = ("python3", "-m", "torch.distributed.run", "--nproc-per-node", "2")
    assert (c.launcher, c.launcher_runs_module) == (launcher, True)
    from tailgate.campaign.run import plan

    (step,) = [s for s in plan(c) if s.kind == "collective"]
    assert step.command()[:9] == [*launcher, "-m", "tailgate", "bench", "allreduce"]


# -- campaign run, end to end ------------------------------------------------------------------

def members_match_their_digests(out: Path, index: dict) -> None:
    for step in index["steps"]:
        for m in step["members"]:
            data = (out / m["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == m["sha256"] and len(data) == m["bytes"]


def test_two_step_campaign_end_to_end(tmp_path):
    require(available())
    with Nginx(workers=1) as ng:
        c = tmp_path / "c.yaml"
        c.write_text(f"name: smoke\ninspect: {{interval: 1, probe_window: 1, during: web}}\n"
                     f"loads:\n  - name: web\n    url: {ng.url('/')}\n    rate: 250\n"
                     "    duration: 4s\n"
                     "    workers: 1\n    slo: ['p99<1s']\n")
        out = tmp_path / "run"
        res = tailgate("campaign", "run", str(c), "--out", str(out))
    # inspect on this VM crosses red lines (no hardware PTP): its step is `gate`, the load's ok
    index = json.loads((out / "campaign.json").read_text())
    steps = {s["name"]: s for s in index["steps"]}
    assert list(steps) == ["inspect", "load web"]
    assert steps["load web"]["status"] == "ok", steps["load web"]
    code = gate_code(json.loads((out / "inspect.json").read_text()))  # what its report decides
    assert steps["inspect"]["exit_status"] == code
    assert steps["inspect"]["status"] == ("ok" if code == 0 else "gate")
    assert res.returncode == code, res.stderr
    assert "[1/2] inspect" in res.stderr and "[2/2] load web: ok" in res.stderr
    # inspect ran while the load ran (`during: web`): started after it; how long it went on
    # after the load had ended is recorded (its start-up on a busy VM takes seconds)
    assert steps["inspect"]["started"] > steps["load web"]["started"]
    assert steps["inspect"]["during"] == "web" and steps["inspect"]["outlasted_load_s"] >= 0
    assert index["tailgate_campaign"] == 1 and index["name"] == "smoke"
    assert index["hosts"] == [os.uname().nodename] and index["finished"] >= index["started"]
    assert index["campaign_file"]["sha256"] == hashlib.sha256(c.read_bytes()).hexdigest()
    members_match_their_digests(out, index)
    bench = json.loads((out / "load-web.json").read_text())
    assert bench["requests"]["sent"] == 1000 and bench["requests"]["ok"] == 1000
    # compare a campaign with itself: every row is there, nothing moved
    res = tailgate("compare", str(out), str(out), "--json", "-", "--max-regression", "p99=1%")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rows = {r["name"]: r for r in doc["rows"]}
    assert rows["web latency.p99"]["significant"] == "no"
    assert rows["web latency.p99"]["before_n"] == 1000
    assert rows["web goodput"]["before"] == bench["rate"]["ok"]
    run_q = rows["l2.sched.runqlat [host]"]
    assert run_q["layer"] == "L2" and run_q["before_ci"] and run_q["significant"] == "no"
    assert [r["layer"] for r in doc["rows"]] == sorted(
        (r["layer"] for r in doc["rows"]), key=["L1", "L2", "L3", "L4", "end-to-end"].index)
    rep = tailgate("campaign", "report", str(out), "--markdown", "-", "--html",
                   str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"))
    assert rep.returncode == 0 and "| load web | ok |" in rep.stdout, rep.stderr
    figures = {m["name"]: m for m in json.loads((tmp_path / "r.json").read_text())["metrics"]}
    assert figures["web latency.p99"]["value"] == bench["latency_ms"]["p99"]
    assert figures["web latency.p99"]["samples"] == 1000
    page = (tmp_path / "r.html").read_text()
    assert "id='figures'" in page and "spectrum-0" in page
    res = tailgate("compare", str(out), str(out / "load-web.json"))
    assert res.returncode == 2 and "with another campaign directory" in res.stderr, res.stderr
    # a member changed after the run is refused, never compared
    (out / "load-web.json").write_text(json.dumps(bench | {"duration_s": 1}))
    res = tailgate("compare", str(out), str(out))
    assert res.returncode == 2 and "sha256 differs" in res.stderr, res.stderr


def test_a_failing_step_is_recorded_and_the_campaign_goes_on(tmp_path):
    require(available())
    with Nginx(workers=1) as ng:
        c = tmp_path / "c.yaml"
        c.write_text(f"inspect: {{interval: 0}}\ntimeout: 20s\nloads:\n"
                     f"  - {{name: refused, url: '{ng.url('/')}', duration: 1s}}  # no rate\n"
                     f"  - {{name: hangs, url: '{ng.url('/')}', rate: 5, duration: 60s}}\n"
                     f"  - {{name: good, url: '{ng.url('/')}', rate: 100, duration: 1s}}\n")
        out = tmp_path / "run"
        res = tailgate("campaign", "run", str(c), "--out", str(out))
    assert res.returncode == 1, res.stderr
    index = json.loads((out / "campaign.json").read_text())
    steps = {s["name"]: s for s in index["steps"]}
    assert list(steps) == ["inspect", "load refused", "load hangs", "load good"]
    bad = steps["load refused"]
    assert bad["status"] == "failed" and bad["exit_status"] == 2
    assert bad["reason"] == "exit status 2: tailgate bench: error: --rate is required", bad
    assert [m["file"] for m in bad["members"]] == ["load-refused.stderr"]  # its own words kept
    hung = steps["load hangs"]
    assert hung["status"] == "failed" and hung["exit_status"] is None
    assert hung["reason"] == "killed after the step's time-out of 20 s"
    assert steps["load good"]["status"] == "ok"
    assert "[2/4] load refused: failed" in res.stderr
    members_match_their_digests(out, index)


def test_with_ray_every_step_gets_the_address_and_no_host_options(tmp_path):
    from tailgate.campaign.run import plan

    c = parse_campaign("ray: 10.0.0.1:6379\ninspect: {interval: 1, probe_window: 2}\nloads:\n"
                       "  - {name: web, url: 'http://10.0.0.2:80/', rate: 10, duration: 1s, "
                       "header: ['X-A: 1', 'X-B: 2'], retry_stale: true}\n",
                       str(tmp_path / "c.yaml"))
    inspect, load = plan(c)
    assert inspect.argv[-2:] == ("--ray", "10.0.0.1:6379") and "--save" not in inspect.argv
    assert inspect.files == ("inspect.json",)
    assert load.argv == ("bench", "http://10.0.0.2:80/", "--rate", "10", "--duration", "1s",
                         "--header", "X-A: 1", "--header", "X-B: 2", "--retry-stale", "--quiet",
                         "--json", "load-web.json", "--ray", "10.0.0.1:6379")
