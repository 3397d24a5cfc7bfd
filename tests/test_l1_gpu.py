"""GPU health (L1): parsers fed real captured nvidia-smi, nvlink, dmesg and DCGM exporter
outputs (tests/fixtures/gpu, each with its provenance line), the NVML reader fed a fake NVML
object built on nvidia-ml-py's own constants (no GPU exists here), and the checks judged on
snapshots built from those parses, plus one collection over a fixture root."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest

from tailgate.baseline import catalog, default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Fact, ParseError, Snapshot
from tailgate.sources import gpu
from tailgate.sources.engine import parse_exposition

FIX = Path(__file__).parent / "fixtures" / "gpu"
GPU_IDS = ("l1.gpu.xid", "l1.gpu.ecc", "l1.gpu.memory_repair", "l1.gpu.nvlink",
           "l1.gpu.clock_events")


def text(name: str) -> str:
    return (FIX / name).read_text()


def snap(facts: dict, before: dict | None = None, interval: float = 5.0,
         earlier: dict | None = None, earlier_at: float | None = None) -> Snapshot:
    def wrap(d):
        return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in (d or {}).items()}
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=interval, taken_at=1000.0,
                    facts=wrap(facts), before=wrap(before), earlier=wrap(earlier),
                    earlier_at=earlier_at)


def judge(check_id: str, s: Snapshot, **params):
    p = {**default_baseline().get(check_id), **params}
    return run_check(check_id, checks()[check_id], s, p)


def health(gpus: dict, source: str = "nvidia-smi -q") -> dict:
    return {"source": source, "gpus": gpus, "tried": {}}


def test_every_gpu_fixture_names_its_source():
    for f in FIX.iterdir():
        first = f.read_text().splitlines()[0]
        # the search index's id, or the public thread it was copied from
        assert first.startswith("# source: ") and ("index id" in first
                                                   or "github.com/" in first), f.name


# -- nvidia-smi -q, every layout -----------------------------------------------------------------

def test_smi_418_old_single_double_bit_tables_and_retired_pages():
    g = gpu.parse_smi_health(text("nvidia-smi-q-418.67-v100.txt"))["0004:04:00.0"]
    assert g["ecc_mode"] == "Enabled"
    # Device Memory is DRAM; Register File, L1, L2 (and CBU where a number) sum to SRAM
    assert g["ecc"]["volatile"] == {"dram_correctable": 0, "sram_correctable": 0,
                                    "dram_uncorrectable": 0, "sram_uncorrectable": 0}
    assert g["retired_pages"] == {"single_bit": 0, "double_bit": 0, "pending": False}
    assert "remapped_rows" not in g
    assert g["clock_events"]["idle"] is True and g["clock_events"]["hw_slowdown"] is False


def test_smi_535_parity_and_sec_ded_split_and_a_real_aggregate_correctable():
    g = gpu.parse_smi_health(text("nvidia-smi-q-535.247.01-a10g.txt"))["0000:00:1e.0"]
    assert g["ecc"]["aggregate"]["dram_correctable"] == 1
    assert g["ecc"]["volatile"]["sram_uncorrectable"] == 0
    assert "SRAM Threshold Exceeded" not in str(g["ecc"])
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False,
                                  "failure": False}
    assert "retired_pages" not in g  # every value N/A: absent, not zero


def test_smi_545_h100_layout():
    g = gpu.parse_smi_health(text("nvidia-smi-q-545.23.08-h100.txt"))["0000:19:00.0"]
    assert set(g["ecc"]["volatile"]) == {"sram_correctable", "sram_uncorrectable",
                                         "dram_correctable", "dram_uncorrectable"}
    assert g["remapped_rows"]["failure"] is False


def test_smi_580_counters_in_microseconds_and_no_ecc_memory():
    g = gpu.parse_smi_health(text("nvidia-smi-q-580.173.02-rtx.txt"))["0000:01:00.0"]
    assert g["clock_event_us"] == {"sw_power_cap": 12234991553, "sync_boost": 0,
                                   "sw_thermal": 11591399010, "hw_thermal": 0,
                                   "hw_power_brake": 0}
    assert g["ecc"] == {} and g["ecc_mode"] == gpu.UNSUPPORTED  # Current: N/A
    assert "remapped_rows" not in g and "retired_pages" not in g


def test_smi_malformed_counts_are_parse_errors():
    bad = text("nvidia-smi-q-545.23.08-h100.txt").replace(
        "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : lots", 1)
    with pytest.raises(ParseError, match="DRAM Uncorrectable: not a count"):
        gpu.parse_smi_health(bad)
    with pytest.raises(ParseError, match="no 'GPU <bus id>'"):
        gpu.parse_smi_health("NVIDIA-SMI has failed because it couldn't communicate")


# -- nvlink, dmesg, DCGM -------------------------------------------------------------------------

def test_nvlink_error_counters_and_status():
    e = gpu.parse_nvlink_errors(text("nvidia-smi-nvlink-e-h100.txt"))
    assert e["0"]["links"]["17"] == {"replay": 0, "recovery": 0, "crc": 0}
    assert set(e["0"]["links"]) == {"0", "1", "17"}  # the book's "[...]" is no link
    s = gpu.parse_nvlink_status(text("nvidia-smi-nvlink-s-h100.txt"))
    assert s == {"0": {"0": "active", "17": "active"}}
    inactive = text("nvidia-smi-nvlink-s-h100.txt").replace("Link 17: 26.562 GB/s",
                                                             "Link 17: <inactive>")
    assert gpu.parse_nvlink_status(inactive)["0"]["17"] == "inactive"


def test_xid_lines_of_three_real_logs():
    assert [(e["kind"], e["bdf"], e["code"], e["t_s"])
            for e in gpu.parse_xid(text("dmesg-xid-79.txt"))] \
        == [("xid", "0000:01:00.0", 79, 24307.640018),
            # the NVRM line after it says the same without an Xid (read on its own, it is
            # what a GPU that fell off the bus with no Xid leaves); the other lines are neither
            ("nvrm_fell_off_bus", "0000:01:00.0", None, 24307.640021)]
    assert [e["code"] for e in gpu.parse_xid(text("dmesg-xid-119-gsp.txt"))] == [119, 119]
    assert [e["code"] for e in gpu.parse_xid(text("dmesg-xid-94-64.txt"))] == [64, 94]
    assert gpu.parse_xid("kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE")[0]["t_s"] is None
    with pytest.raises(ParseError, match="Xid line that does not parse"):
        gpu.parse_xid("[ 1.0] NVRM: Xid (PCI:0000:3b:00): seventy-nine")


def test_dcgm_exporter_scrapes():
    l4 = gpu.parse_dcgm(parse_exposition(text("dcgm-exporter-580.105.08-l4.prom")))
    assert l4["0000:31:00.0"]["remapped_rows"] == {"uncorrectable": 0, "correctable": 0,
                                                   "failure": False}
    vgpu = gpu.parse_dcgm(parse_exposition(text("dcgm-exporter-580.65.06-vgpu.prom")))
    assert vgpu["0000:03:00.0"]["xid_last"] == 0
    assert gpu.reasons_from_mask(0x48) == {**{k: False for k in gpu.REASON_BITS.values()},
                                           "hw_slowdown": True, "hw_thermal": True}


# -- NVML: nvidia-ml-py's API, fed a fake NVML (no GPU here) -------------------------------------

def installed_pynvml():
    """nvidia-ml-py is in the test extra: its absence fails with the reason, never skips."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError as exc:
        pytest.fail(f"nvidia-ml-py is not installed (pip install -e '.[test]'): {exc}")
    return pynvml


def fake_nvml(**over):
    """An object with pynvml's names and constants (from the installed nvidia-ml-py) whose
    device calls answer like one H100 with 18 NVLinks."""
    pynvml = installed_pynvml()
    st = {"unc_dram": 0, "replay": {3: 2}, "mask": 0x1, "rows": (0, 0, 0, 0),
          "power_ns": 0, "thermal_ns": 0, **over}
    NS = pynvml.NVMLError_NotSupported

    def err_counter(h, err, counter, loc):
        if loc == pynvml.NVML_MEMORY_LOCATION_DRAM:
            return st["unc_dram"] if err == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0
        if loc == pynvml.NVML_MEMORY_LOCATION_SRAM:
            return 0
        raise NS(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def link_state(h, link):
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def violation(h, policy):
        ns = {pynvml.NVML_PERF_POLICY_POWER: st["power_ns"],
              pynvml.NVML_PERF_POLICY_THERMAL: st["thermal_ns"]}.get(policy, 0)
        return types.SimpleNamespace(referenceTime=0, violationTime=ns)

    fake = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml)
                                    if k.startswith(("NVML_", "NVMLError"))})
    fake.nvmlDeviceGetCount = lambda: 1
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    fake.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:19:00.0")
    fake.nvmlDeviceGetEccMode = lambda h: [pynvml.NVML_FEATURE_ENABLED] * 2
    fake.nvmlDeviceGetMemoryErrorCounter = err_counter
    fake.nvmlDeviceGetTotalEccErrors = lambda h, e, c: 0
    fake.nvmlDeviceGetRemappedRows = lambda h: st["rows"]
    fake.nvmlDeviceGetCurrentClocksEventReasons = lambda h: st["mask"]
    fake.nvmlDeviceGetViolationStatus = violation
    fake.nvmlDeviceGetNvLinkState = link_state
    fake.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, c: st["replay"].get(link, 0) \
        if c == pynvml.NVML_NVLINK_ERROR_DL_REPLAY else 0
    return fake


def test_nvml_reader_builds_the_same_sections():
    g = gpu.nvml_health(fake_nvml())["0000:19:00.0"]
    assert g["ecc_mode"] == "Enabled"
    assert g["ecc"]["volatile"] == {"dram_correctable": 0, "sram_correctable": 0,
                                    "dram_uncorrectable": 0, "sram_uncorrectable": 0}
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False,
                                  "failure": False}
    assert len(g["nvlink_state"]) == 18 and g["nvlink"]["3"]["replay"] == 2
    assert g["clock_events"]["idle"] is True and g["violation_us"]["power"] == 0


def test_nvml_absent_library_is_a_reason_not_a_crash():
    pynvml = installed_pynvml()
    try:  # what this host is: a GPU host has libnvidia-ml.so and a driver, this VM has neither
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        with pytest.raises(gpu.SourceError, match="NVML"):
            gpu._nvml(["0000:19:00.0"])
        assert str(exc) in str(pytest.raises(gpu.SourceError, gpu._nvml, ["0000:19:00.0"]).value)
        return
    pynvml.nvmlShutdown()
    # the library answers: _nvml reads the GPUs asked for, and none that was not asked for
    got = gpu._nvml(["ffff:ff:1f.7"])  # no such device
    assert got == {}


def test_checks_judge_nvml_growth():
    before = gpu.nvml_health(fake_nvml())
    after = gpu.nvml_health(fake_nvml(unc_dram=1, replay={3: 5}, mask=0x48,
                                      rows=(0, 1, 1, 0), thermal_ns=2_000_000_000))
    s = snap({"gpu.health": health(after, "NVML")}, {"gpu.health": health(before, "NVML")},
             interval=10.0)
    ecc = judge("l1.gpu.ecc", s)[0]
    assert (ecc.status, ecc.observed) == ("fail", 1.0)
    nvl = judge("l1.gpu.nvlink", s)[0]
    assert nvl.status == "fail" and "link 3: 3" in nvl.reason
    clk = judge("l1.gpu.clock_events", s)[0]
    assert clk.status == "fail" and "HW slowdown" in clk.reason and "thermal 20.0%" in clk.reason
    rep = judge("l1.gpu.memory_repair", s)[0]
    assert rep.status == "fail" and "uncorrectable" in rep.reason and "pending" in rep.reason


# -- checks on the real layouts ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("nvidia-smi-q-*")))
def test_quiet_captures_pass_or_skip_never_fail(name):
    gpus = gpu.parse_smi_health(text(name))
    h = health(gpus)
    s = snap({"gpu.health": h}, {"gpu.health": copy.deepcopy(h)})
    for cid in ("l1.gpu.ecc", "l1.gpu.memory_repair", "l1.gpu.clock_events"):
        res = judge(cid, s)
        assert all(r.status in ("pass", "skip") for r in res), (cid, [(r.status, r.reason)
                                                                      for r in res])
    rtx = judge("l1.gpu.ecc", s)[0]
    if "580" in name:
        assert rtx.status == "skip"  # no ECC memory on a GeForce card
    else:
        assert rtx.status == "pass"


def test_580_counters_grown_by_the_driver_are_a_share_of_the_window():
    before = gpu.parse_smi_health(text("nvidia-smi-q-580.173.02-rtx.txt"))
    after = copy.deepcopy(before)
    g = after["0000:01:00.0"]["clock_event_us"]
    g["sw_thermal"] += 3_000_000  # 3 s of SW thermal slowdown in a 10 s window
    s = snap({"gpu.health": health(after)}, {"gpu.health": health(before)}, interval=10.0)
    r = judge("l1.gpu.clock_events", s)[0]
    assert (r.status, r.observed) == ("fail", 0.3)
    assert "SW thermal slowdown 30.0%" in r.reason
    g["sw_thermal"] -= 3_000_000
    g["sw_power_cap"] += 2_000_000  # 20 % under the power cap: warn
    r = judge("l1.gpu.clock_events", snap({"gpu.health": health(after)},
                                          {"gpu.health": health(before)}, interval=10.0))[0]
    assert r.status == "warn" and "SW power cap 20.0%" in r.reason


def test_remapping_failure_and_pending_from_the_535_layout():
    edited = text("nvidia-smi-q-535.247.01-a10g.txt").replace(
        "Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes")
    gpus = gpu.parse_smi_health(edited)
    r = judge("l1.gpu.memory_repair", snap({"gpu.health": health(gpus)},
                                           {"gpu.health": health(gpus)}))[0]
    assert r.status == "fail" and "no spare row" in r.reason
    pend = gpu.parse_smi_health(text("nvidia-smi-q-535.247.01-a10g.txt").replace(
        "Pending                           : No", "Pending                           : Yes"))
    r = judge("l1.gpu.memory_repair", snap({"gpu.health": health(pend)},
                                           {"gpu.health": health(pend)}))[0]
    assert r.status == "warn" and "pending" in r.reason


def test_ecc_without_a_window_is_unknown_unless_uncorrectable_already_counted():
    gpus = gpu.parse_smi_health(text("nvidia-smi-q-545.23.08-h100.txt"))
    r = judge("l1.gpu.ecc", snap({"gpu.health": health(gpus)}, interval=0.0))[0]
    assert r.status == "unknown"
    gpus["0000:19:00.0"]["ecc"]["volatile"]["dram_uncorrectable"] = 2
    r = judge("l1.gpu.ecc", snap({"gpu.health": health(gpus)}, interval=0.0))[0]
    assert r.status == "fail" and "dram_uncorrectable" in r.reason


def test_nvlink_growth_from_nvidia_smi_and_inactive_links():
    links = gpu.parse_nvlink_errors(text("nvidia-smi-nvlink-e-h100.txt"))["0"]["links"]
    state = gpu.parse_nvlink_status(text("nvidia-smi-nvlink-s-h100.txt"))["0"]
    before = {"0000:19:00.0": {"ecc": {}, "nvlink": links, "nvlink_state": state}}
    after = copy.deepcopy(before)
    after["0000:19:00.0"]["nvlink"]["17"]["crc"] = 4
    r = judge("l1.gpu.nvlink", snap({"gpu.health": health(after)},
                                    {"gpu.health": health(before)}))[0]
    assert (r.status, r.observed) == ("fail", 4.0) and "link 17: 4" in r.reason
    before["0000:19:00.0"]["nvlink_state"]["1"] = "inactive"
    r = judge("l1.gpu.nvlink", snap({"gpu.health": health(before)},
                                    {"gpu.health": health(copy.deepcopy(before))}))[0]
    assert r.status == "warn" and "link(s) 1 inactive" in r.reason


# -- Xid window ----------------------------------------------------------------------------------

def xid_fact(log: str, uptime: float, boot: str = "b1") -> dict:
    events = gpu.parse_xid(log)
    return {"gpus": sorted({e["bdf"] for e in events}), "events": events,
            "uptime_s": uptime, "boot_id": boot}


def test_xid_in_the_window_fails_before_it_passes():
    log = text("dmesg-xid-79.txt")
    s = snap({"gpu.xid": xid_fact(log, 24310.0)}, {"gpu.xid": xid_fact("", 24300.0)})
    r = judge("l1.gpu.xid", s)[0]
    assert r.status == "fail" and "Xid 79 GPU has fallen off the bus" in r.reason
    assert r.evidence["in_window"][0]["class"] == "hardware"
    s = snap({"gpu.xid": xid_fact(log, 24400.0)}, {"gpu.xid": xid_fact(log, 24390.0)})
    r = judge("l1.gpu.xid", s)[0]
    assert r.status == "pass" and "2 earlier in this boot" in r.reason


def test_xid_gsp_and_ecc_codes_fail_application_codes_warn():
    gsp = text("dmesg-xid-119-gsp.txt")
    r = judge("l1.gpu.xid", snap({"gpu.xid": xid_fact(gsp, 4000.0)},
                                 {"gpu.xid": xid_fact("", 3900.0)}))[0]
    assert (r.status, r.observed) == ("fail", 2) and "GSP RPC timeout" in r.reason
    ecc = text("dmesg-xid-94-64.txt")
    r = judge("l1.gpu.xid", snap({"gpu.xid": xid_fact(ecc, 2397200.0)},
                                 {"gpu.xid": xid_fact("", 2397166.95)}))[0]
    assert r.status == "fail" and [e["code"] for e in r.evidence["in_window"]] == [94]
    app = "[ 12.0] NVRM: Xid (PCI:0000:01:00): 13, pid=123, Graphics Exception"
    r = judge("l1.gpu.xid", snap({"gpu.xid": xid_fact(app, 20.0)},
                                 {"gpu.xid": xid_fact("", 10.0)}))[0]
    assert r.status == "warn" and "not the GPU" in r.reason


def test_xid_after_a_reboot_or_without_window_is_unknown():
    log = text("dmesg-xid-79.txt")
    r = judge("l1.gpu.xid", snap({"gpu.xid": xid_fact(log, 30.0, "b2")},
                                 {"gpu.xid": xid_fact("", 24000.0, "b1")}))[0]
    assert r.status == "unknown" and "no earlier reading" in r.reason
    r = judge("l1.gpu.xid", snap({"gpu.xid": xid_fact(log, 25000.0)}))[0]
    assert r.status == "unknown"
    assert judge("l1.gpu.xid", snap({"gpu.xid": {"gpus": [], "events": []}}))[0].status == "skip"


# -- catalog and a collection over a fixture root ------------------------------------------------

def test_catalog_entries_explain_and_flow_into_rules():
    from tailgate.rules import RuleOptions, red_line_rules

    cat = catalog()
    alerts = {r["labels"]["id"] for r in red_line_rules(default_baseline(), RuleOptions())
              if "labels" in r and "id" in r["labels"]}
    for cid in GPU_IDS:
        assert cat[cid].layer == "L1" and cat[cid].rationale and cat[cid].remedy
        assert cid in alerts


def gpu_root(tmp: Path, smi: str, dmesg: str, uptime: str = "24400.00 1000.00") -> Path:
    dev = tmp / "sys/bus/pci/devices/0000:19:00.0"
    dev.mkdir(parents=True)
    (dev / "class").write_text("0x030200\n")
    (dev / "vendor").write_text("0x10de\n")
    (tmp / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp / "proc/uptime").write_text(uptime + "\n")
    (tmp / "proc/sys/kernel/random/boot_id").write_text("b1\n")
    (tmp / "proc/sys/kernel/hostname").write_text("gpu-node\n")
    cmds = tmp / "commands"
    cmds.mkdir()
    (cmds / "nvidia-smi_-q").write_text(smi)
    (cmds / "dmesg").write_text(dmesg)
    (cmds / "nvidia-smi_nvlink_-e").write_text(text("nvidia-smi-nvlink-e-h100.txt"))
    (cmds / "nvidia-smi_nvlink_-s").write_text(text("nvidia-smi-nvlink-s-h100.txt"))
    return tmp


def test_collect_over_a_root_reads_nvidia_smi_and_the_kernel_log(tmp_path):
    root = gpu_root(tmp_path, text("nvidia-smi-q-545.23.08-h100.txt"), text("dmesg-xid-79.txt"))
    s = collect(Host(str(root)), Scope(), 0.6)
    h = s.facts["gpu.health"].value
    assert h["source"] == "nvidia-smi -q"
    assert h["gpus"]["0000:19:00.0"]["nvlink"]["17"] == {"replay": 0, "recovery": 0, "crc": 0}
    from tailgate.judge import judge as judge_all
    got = {f.id: f.status for f in judge_all(s, default_baseline()) if f.id in GPU_IDS}
    # The same readings at t0 and t1: nothing grew. The Xid 79 of PCI:0000:01:00 is older
    # than the window and on another GPU.
    assert got == {"l1.gpu.xid": "pass", "l1.gpu.ecc": "pass", "l1.gpu.memory_repair": "pass",
                   "l1.gpu.nvlink": "pass", "l1.gpu.clock_events": "pass"}


def test_collect_without_a_source_is_unknown_with_every_reason(tmp_path):
    root = gpu_root(tmp_path, "", "")
    (root / "commands/nvidia-smi_-q").unlink()
    s = collect(Host(str(root)), Scope(), 0.0)
    f = s.facts["gpu.health"]
    assert f.ok and "no captured output" in f.value["tried"]["nvidia-smi"]
    for cid in GPU_IDS[1:]:  # the GPU of the PCI tree is a subject, unknown with the reason
        [r] = judge(cid, s)
        assert (r.status, r.subject) == ("unknown", "0000:19:00.0 gpu"), cid
        assert "no NVIDIA source answered" in r.reason and "nvidia-smi" in r.reason, cid


def test_serve_exports_the_new_findings():
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from tailgate.judge import judge as judge_all
    from tailgate.report.prometheus import report_metrics
    from tailgate.verdict import build_report

    log = text("dmesg-xid-79.txt")
    s = snap({"gpu.xid": xid_fact(log, 24310.0), "gpu.health": Fact(missing="no source")},
             {"gpu.xid": xid_fact("", 24300.0)})
    report = build_report(s, judge_all(s, default_baseline()), frozenset())

    class One:
        def collect(self):
            return report_metrics(report)

    reg = CollectorRegistry()
    reg.register(One())
    body = generate_latest(reg).decode()
    assert 'id="l1.gpu.xid"' in body and 'subject="0000:01:00.0 gpu"' in body
    line = next(x for x in body.splitlines() if x.startswith("tailgate_finding_status{")
                and 'id="l1.gpu.xid"' in x and 'status="fail"' in x)
    assert line.endswith(" 1.0")


def test_inspect_dcgm_option_end_to_end(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/hostname").write_text("dcgm-node\n")
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root",
                               str(tmp_path), "--interval", "0", "--no-history", *args],
                              capture_output=True, text=True, timeout=120)

    proc = run("--dcgm", str(FIX / "dcgm-exporter-580.105.08-l4.prom"), "--json", "-")
    # an empty root: nothing fails (the DCGM GPU passes or is unknown, the rest unknown/skip)
    assert proc.returncode == 0, proc.stderr
    got = {f["id"]: f for f in json.loads(proc.stdout)["findings"] if f["id"] in GPU_IDS}
    rep = got["l1.gpu.memory_repair"]
    assert rep["subject"] == "0000:31:00.0 gpu" and rep["status"] == "pass"
    assert rep["evidence"]["source"].startswith("DCGM exporter")
    # the exporter's default counters carry no NVLink field: not collected, not "no links"
    assert got["l1.gpu.nvlink"]["status"] == "unknown"
    assert "carries no NVLink counters" in got["l1.gpu.nvlink"]["reason"]
    bad = run("--dcgm", str(tmp_path / "nope.prom"))
    assert bad.returncode == 2 and "--dcgm" in bad.stderr
