"""The counter-history store: windows, resets, concurrency, and refusing files that are not ours."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from support.inspect import gate_code
from tailgate import history
from tailgate.history import HistoryError, HistoryStore, NoWindow, attach_history, growth
from tailgate.model import Fact, Snapshot

ROOT = Path(__file__).parent / "fixtures" / "roots" / "l1l3-clean"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_first_run_has_no_earlier_then_each_run_sees_the_previous(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite")
    assert store.record("a", 100.0, {"c": 1}) is None
    assert store.record("b", 150.0, {"c": 99}) is None  # hosts are separate
    last = store.record("a", 200.0, {"c": 5})
    assert last == history.StoredRun(100.0, {"c": 1})
    assert store.record("a", 300.0, {"c": 7}).counters == {"c": 5}
    assert [r.taken_at for r in store.runs("a")] == [100.0, 200.0, 300.0]


def test_old_runs_are_pruned_per_host(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "KEEP_RUNS", 3)
    store = HistoryStore(tmp_path / "h.sqlite")
    for t in range(6):
        store.record("a", float(t), {"c": t})
    store.record("b", 0.0, {})
    assert [r.taken_at for r in store.runs("a")] == [3.0, 4.0, 5.0]
    assert len(store.runs("b")) == 1


def test_empty_file_is_a_new_database(tmp_path):
    path = tmp_path / "h.sqlite"
    path.write_bytes(b"")
    assert HistoryStore(path).record("a", 1.0, {}) is None
    assert HistoryStore(path).record("a", 2.0, {}) is not None


def test_foreign_text_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "h.sqlite"
    path.write_text("my notes, not a database\n")
    before = digest(path)
    with pytest.raises(HistoryError, match="not an SQLite file.*left untouched"):
        HistoryStore(path).record("a", 1.0, {"c": 1})
    assert digest(path) == before


def test_foreign_sqlite_database_is_refused_and_untouched(tmp_path):
    path = tmp_path / "h.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE runs (x)")
    db.commit()
    db.close()
    before = digest(path)
    with pytest.raises(HistoryError, match="did not create"):
        HistoryStore(path).record("a", 1.0, {})
    assert digest(path) == before


def test_corrupt_database_is_refused_and_untouched(tmp_path):
    path = tmp_path / "h.sqlite"
    store = HistoryStore(path)
    for t in range(50):
        store.record("a", float(t), {"counter": "x" * 500, "n": t})
    data = bytearray(path.read_bytes())
    assert len(data) > 8192
    data[4096:8192] = b"\xa5" * 4096  # smash a page, keep the header (ours, still SQLite)
    path.write_bytes(bytes(data))
    before = digest(path)
    with pytest.raises(HistoryError, match="corrupt"):
        store.record("a", 99.0, {"n": 99})
    assert digest(path) == before


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "h.sqlite"
    HistoryStore(path).record("a", 1.0, {})
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(HistoryError, match="newer tailgate"):
        HistoryStore(path).record("a", 2.0, {})


def _writer(args: tuple[str, int]) -> list[bool]:
    path, worker = args
    store = HistoryStore(path)
    return [store.record("host", worker * 1000.0 + i, {"w": worker, "i": i}) is not None
            for i in range(15)]


def test_concurrent_runs_do_not_corrupt_or_lose_runs(tmp_path):
    path = str(tmp_path / "h.sqlite")
    with ProcessPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(_writer, [(path, w) for w in range(6)]))
    flat = [r for rs in results for r in rs]
    assert flat.count(False) == 1  # exactly one run in all was the first
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 90
    db.close()


# -- windows -------------------------------------------------------------------------------------

def snap(now, before=None, interval=5.0, earlier=None, earlier_at=None) -> Snapshot:
    return Snapshot(host={"hostname": "h"}, target={}, interval_s=interval, taken_at=1000.0,
                    facts={"c": Fact(value=now)},
                    before={"c": Fact(value=before)} if before is not None else {},
                    earlier={"c": Fact(value=earlier)} if earlier is not None else {},
                    earlier_at=earlier_at)


def test_history_window_is_preferred_and_stated():
    g = growth(snap({"x": 10}, {"x": 10}, earlier={"x": 4}, earlier_at=1005.0 - 7200.0), "c")
    assert g.source == "history" and g.window_s == 7200.0 and g.deltas == {"x": 6.0}
    assert g.per_hour == {"x": 3.0} and "since the last stored run" in g.describe()


def test_backwards_counter_starts_a_new_window():
    g = growth(snap({"x": 10}, {"x": 8}, earlier={"x": 500}, earlier_at=0.0), "c")
    assert g.source == "interval" and g.deltas == {"x": 2.0} and "went backwards" in g.note
    with pytest.raises(NoWindow, match="went backwards"):
        growth(snap({"x": 10}, {"x": 8}, interval=0.0, earlier={"x": 500}, earlier_at=0.0), "c")
    with pytest.raises(NoWindow, match="during the interval"):
        growth(snap({"x": 1}, {"x": 8}), "c")


def test_too_short_windows_give_no_rate():
    with pytest.raises(NoWindow, match="no earlier run"):
        growth(snap({"x": 1}, {"x": 1}, interval=0.1), "c")
    with pytest.raises(NoWindow, match="only 0.10 s old"):
        growth(snap({"x": 1}, {"x": 1}, interval=0.0, earlier={"x": 1}, earlier_at=999.9), "c")


def test_counter_absent_from_the_stored_run_uses_the_interval():
    g = growth(snap({"x": 3}, {"x": 1}, earlier={"y": 1}, earlier_at=0.0), "c")
    assert g.source == "interval" and g.deltas == {"x": 2.0}


def test_attach_history_stores_counters_and_round_trips_json(tmp_path):
    def run(taken_at: float, aer: int) -> Snapshot:
        now = {"pci.aer": Fact(value={"counters": {"0000:81:00.0": {"BadTLP": aer}}}),
               "net.snmp": Fact(value={"Tcp": {"RetransSegs": 5}}),
               "not_a_counter": Fact(value=7)}
        return Snapshot(host={"hostname": "h"}, target={}, interval_s=0.0, taken_at=taken_at,
                        facts=now, before={k: v for k, v in now.items() if k != "not_a_counter"})

    s1 = attach_history(run(1000.0, 1), tmp_path)
    assert s1.earlier == {} and s1.earlier_at is None
    s2 = attach_history(run(1060.0, 4), tmp_path)
    assert s2.earlier_at == 1000.0
    assert s2.earlier == {"pci.aer": Fact(value={"counters": {"0000:81:00.0": {"BadTLP": 1}}})}
    # Only the long-window counters are stored; interval-judged ones are not.
    stored = HistoryStore(tmp_path / "history.sqlite").runs("h")[-1].counters
    assert set(stored) == {"pci.aer"}
    again = Snapshot.from_json(json.loads(json.dumps(s2.to_json())))
    assert again.earlier == s2.earlier and again.earlier_at == 1000.0
    old = s2.to_json()
    del old["earlier"], old["earlier_at"]  # a snapshot saved before the history existed
    assert Snapshot.from_json(old).earlier == {} and Snapshot.from_json(old).earlier_at is None


def test_live_host_and_a_root_of_the_same_name_keep_separate_histories(tmp_path):
    def run(root: str) -> Snapshot:
        return Snapshot(host={"hostname": "vm", "root": root}, target={}, interval_s=0.0,
                        taken_at=1.0, facts={"pci.aer": Fact(value={"counters": {}})},
                        before={"pci.aer": Fact(value={"counters": {}})})

    attach_history(run("/"), tmp_path)
    assert attach_history(run("/srv/captured-vm"), tmp_path).earlier_at is None
    assert attach_history(run("/"), tmp_path).earlier_at == 1.0
    assert history.host_key(run("/srv/captured-vm")) == "vm@/srv/captured-vm"


def _cli_run(args: tuple[str, str, str]) -> tuple[int, int]:
    """(exit status, the status its own JSON report decides)."""
    root, state, out = args
    code = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root", root, "--state",
                           state, "--interval", "0", "--quiet", "--json", out],
                          capture_output=True, timeout=120).returncode
    return code, gate_code(json.loads(Path(out).read_text()))


def test_concurrent_cli_runs_all_land_in_one_healthy_database(tmp_path):
    runs = [(str(ROOT), str(tmp_path), str(tmp_path / f"r{i}.json")) for i in range(6)]
    with ProcessPoolExecutor(max_workers=4) as pool:
        codes = list(pool.map(_cli_run, runs))
    assert all(got == decided for got, decided in codes), codes
    db = sqlite3.connect(tmp_path / "history.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT count(*) FROM runs WHERE host = ?",
                      (f"rack7-gpu03@{ROOT}",)).fetchone()[0] == 6
    db.close()


# -- the CLI -------------------------------------------------------------------------------------

def tailgate(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_cli_refuses_a_foreign_state_file_with_a_clear_error(tmp_path):
    (tmp_path / "history.sqlite").write_text("precious\n")
    proc = tailgate("inspect", "--root", str(ROOT), "--state", str(tmp_path), "--interval", "0",
                    "--quiet")
    assert proc.returncode == 2
    assert "counter history" in proc.stderr and "left untouched" in proc.stderr
    assert (tmp_path / "history.sqlite").read_text() == "precious\n"


def test_cli_default_state_dir_is_xdg(tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    proc = tailgate("inspect", "--root", str(ROOT), "--interval", "0", "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr  # the clean root: nothing fails
    key = f"rack7-gpu03@{ROOT}"  # a root read under a path has its own history
    runs = HistoryStore(tmp_path / "xdg" / "tailgate" / "history.sqlite").runs(key)
    assert len(runs) == 1 and "ethtool.fec.eth2" in runs[0].counters
    proc = tailgate("inspect", "--root", str(ROOT), "--interval", "0", "--quiet", "--no-history",
                    env=env)
    assert len(HistoryStore(tmp_path / "xdg" / "tailgate" / "history.sqlite").runs(key)) == 1


# -- hostile state: what the database holds, and links --------------------------------------------

def tree(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Everything under ``root`` (but ``skip``): type, size, mtime and content, to show that
    nothing outside the state directory changed."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        if skip is not None and Path(dirpath) == skip:
            dirs[:] = []
            continue
        for name in dirs + files:
            p = Path(dirpath) / name
            if skip is not None and p == skip:
                continue
            st = os.lstat(p)
            if os.path.islink(p):
                out[str(p)] = ("link", os.readlink(p))
            elif p.is_file():
                out[str(p)] = ("file", st.st_size, st.st_mtime_ns, st.st_mode, digest(p))
            else:
                out[str(p)] = ("dir", st.st_mode)
    return out


def inspect_json(state: Path, root: Path = ROOT) -> tuple[subprocess.CompletedProcess, dict]:
    proc = tailgate("inspect", "--root", str(root), "--state", str(state), "--interval", "0",
                    "--json", "-", "--quiet")
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc, report


def findings(report: dict, cid: str) -> list[dict]:
    return [f for f in report["findings"] if f["id"] == cid]


def tamper(state: Path, sql: str, *args) -> None:
    db = sqlite3.connect(state / "history.sqlite")
    db.execute(sql, args)
    db.commit()
    db.close()


def test_stored_nan_counter_is_unknown_never_grew_by_nan(tmp_path):
    proc, report = inspect_json(tmp_path)
    assert proc.returncode == gate_code(report), proc.stderr
    proc, _ = inspect_json(tmp_path)
    row = sqlite3.connect(tmp_path / "history.sqlite").execute(
        "SELECT id, counters FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    counters = json.loads(row[1])
    assert "ethtool.fec.eth2" in counters
    counters["ethtool.fec.eth2"]["stats"]["uncorrectable_blocks"]["total"] = float("nan")
    text = json.dumps(counters)  # json writes NaN as the bare word NaN, as an editor could
    assert '"total": NaN' in text
    tamper(tmp_path, "UPDATE runs SET counters = ? WHERE id = ?", text, row[0])
    proc, report = inspect_json(tmp_path)
    assert proc.returncode == gate_code(report), proc.stderr
    fec = [f for f in findings(report, "l1.fec.uncorrectable") if f.get("subject") == "eth2"]
    assert len(fec) == 1 and fec[0]["status"] == "unknown", fec
    assert "last stored run" in fec[0]["reason"] and "nan" in fec[0]["reason"]
    # The broken row is judged once: this run stored a good one after it (made an hour old).
    tamper(tmp_path, "UPDATE runs SET taken_at = taken_at - 3600")
    proc, report = inspect_json(tmp_path)
    fec = [f for f in findings(report, "l1.fec.uncorrectable") if f.get("subject") == "eth2"]
    assert fec[0]["status"] == "pass" and "since the last stored run" in json.dumps(fec[0])


def test_a_nan_window_never_passes():
    s = snap({"x": 3}, {"x": 1}, earlier={"x": float("nan")}, earlier_at=0.0)
    with pytest.raises(NoWindow, match="not a finite number"):
        growth(s, "c")
    with pytest.raises(NoWindow, match="not a finite number"):
        growth(snap({"x": float("inf")}, {"x": 1.0}), "c")


@pytest.mark.parametrize("stamp", ["yesterday", b"\x00\x01", None, 1e300])
def test_a_stored_time_stamp_that_is_not_a_number_is_unknown_not_a_traceback(tmp_path, stamp):
    inspect_json(tmp_path)
    inspect_json(tmp_path)
    if stamp is None:  # NOT NULL: an editor would have to rebuild the table; take the text 'NULL'
        stamp = "NULL"
    tamper(tmp_path, "UPDATE runs SET taken_at = ? WHERE id = (SELECT max(id) FROM runs)", stamp)
    proc, report = inspect_json(tmp_path)
    assert proc.returncode == gate_code(report), proc.stderr  # committed, judged: no exit 3
    fec = [f for f in findings(report, "l1.fec.uncorrectable") if f.get("subject") == "eth2"]
    assert fec[0]["status"] == "unknown", fec
    assert "time stamp" in fec[0]["reason"] and "cannot be used" in fec[0]["reason"]
    assert not [f for f in report["findings"] if f["status"] == "error"]
    tamper(tmp_path, f"UPDATE runs SET taken_at = taken_at - 3600 WHERE {history._SANE_TIME}")
    proc, report = inspect_json(tmp_path)  # the next run has a good row before it
    fec = [f for f in findings(report, "l1.fec.uncorrectable") if f.get("subject") == "eth2"]
    assert fec[0]["status"] == "pass", fec


def test_stored_run_validation_names_what_is_wrong():
    assert history._stored_run("x", "{}").bad.startswith("its time stamp is not a number")
    assert history._stored_run(float("inf"), "{}").bad == "its time stamp is inf"
    assert history._stored_run(1.0, "[1]").bad == "its counters are not a JSON object"
    assert "not valid JSON" in history._stored_run(1.0, "{").bad
    run = history._stored_run(1.0, '{"a": {"x": [1, -2]}, "b": {"y": Infinity}, "c": 3}')
    assert run.bad == "" and run.bad_facts == {"a": "a/x/1 is not a counter (-2)",
                                               "b": "b/y is inf"}
    assert history._stored_run(1.0, f'{{"a": {2**70}}}').bad_facts["a"].startswith("a is not")


def outside_and_state(tmp_path: Path) -> tuple[Path, Path]:
    outside, state = tmp_path / "outside", tmp_path / "state"
    outside.mkdir()
    state.mkdir(mode=0o700)
    (outside / "keep.txt").write_text("precious\n")
    return outside, state


@pytest.mark.parametrize("target", ["dangling", "empty", "sqlite"])
def test_a_linked_history_file_is_refused_and_its_target_untouched(tmp_path, target):
    outside, state = outside_and_state(tmp_path)
    dest = outside / "history.sqlite"
    if target == "empty":
        dest.write_bytes(b"")
    elif target == "sqlite":  # even a real history of ours elsewhere is not written through a link
        HistoryStore(dest).record("h", 1.0, {})
    (state / "history.sqlite").symlink_to(dest)
    before = tree(tmp_path)
    proc = tailgate("inspect", "--root", str(ROOT), "--state", str(state), "--interval", "0",
                    "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr and "history.sqlite" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert tree(tmp_path) == before  # not the target, not the state directory either


def test_a_linked_sqlite_side_file_is_refused(tmp_path):
    outside, state = outside_and_state(tmp_path)
    HistoryStore(state / "history.sqlite").record("h", 1.0, {})
    (state / "history.sqlite-journal").symlink_to(outside / "journal")
    before = tree(tmp_path)
    with pytest.raises(HistoryError, match="side file"):
        HistoryStore(state / "history.sqlite").record("h", 2.0, {})
    assert tree(tmp_path) == before


def test_a_hard_link_to_a_file_elsewhere_is_refused(tmp_path):
    outside, state = outside_and_state(tmp_path)
    HistoryStore(outside / "h.sqlite").record("h", 1.0, {})
    os.link(outside / "h.sqlite", state / "history.sqlite")
    before = tree(tmp_path)
    with pytest.raises(HistoryError, match="hard links"):
        HistoryStore(state / "history.sqlite").record("h", 2.0, {})
    assert tree(tmp_path) == before


def test_a_state_directory_that_is_a_link_or_world_writable_is_refused(tmp_path):
    outside, state = outside_and_state(tmp_path)
    linked = tmp_path / "linked"
    linked.symlink_to(outside, target_is_directory=True)
    before = tree(tmp_path)
    with pytest.raises(HistoryError, match="is a symbolic link"):
        HistoryStore(linked / "history.sqlite").record("h", 1.0, {})
    os.chmod(state, 0o777)
    before = tree(tmp_path)
    with pytest.raises(HistoryError, match="world-writable"):
        HistoryStore(state / "history.sqlite").record("h", 1.0, {})
    assert tree(tmp_path) == before
    os.chmod(state, 0o700)
    os.chown(state, 12345, -1)
    with pytest.raises(HistoryError, match="owned by uid 12345"):
        HistoryStore(state / "history.sqlite").record("h", 1.0, {})
    assert not (state / "history.sqlite").exists()


def test_a_fifo_in_place_of_the_history_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "history.sqlite")
    with pytest.raises(HistoryError, match="not a regular file"):
        HistoryStore(tmp_path / "history.sqlite").record("h", 1.0, {})


def test_a_new_history_is_created_private_in_a_new_private_directory(tmp_path):
    state = tmp_path / "new" / "state"
    HistoryStore(state / "history.sqlite").record("h", 1.0, {})
    assert os.stat(state).st_mode & 0o777 == 0o700
    assert os.stat(state / "history.sqlite").st_mode & 0o777 == 0o600


def _in_readonly_mount(path: Path, argv: list[str], bind: bool) -> subprocess.CompletedProcess:
    """Run argv with ``path`` read-only in a mount namespace of its own (the host is untouched):
    a fresh read-only tmpfs, or ``path`` itself bound read-only (its files kept)."""
    mount = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"' if bind
             else 'mount -t tmpfs -o ro tmpfs "$1"')
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env["HOME"] = str(path)
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f'{mount} && shift && exec "$@"', "sh", str(path), *argv],
                          capture_output=True, text=True, timeout=120, env=env)


INSPECT_VM = [sys.executable, "-m", "tailgate", "inspect", "--interval", "0", "--root",
              str(Path(__file__).parent / "fixtures" / "roots" / "vm-kvm"), "--json", "-"]


def test_a_read_only_home_runs_without_history_and_says_so(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    proc = _in_readonly_mount(home, INSPECT_VM, bind=False)
    assert proc.returncode == gate_code(json.loads(proc.stdout)), proc.stderr
    assert json.loads(proc.stdout)["findings"]
    assert "counter history unavailable" in proc.stderr and "Read-only file system" in proc.stderr
    assert "running without it" in proc.stderr


def test_a_read_only_state_dir_with_a_history_runs_without_it(tmp_path):
    state = tmp_path / "state"
    first = subprocess.run([*INSPECT_VM, "--state", str(state)], capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == gate_code(json.loads(first.stdout)) and first.stderr == "", \
        first.stderr
    before = (state / "history.sqlite").read_bytes()
    proc = _in_readonly_mount(state, [*INSPECT_VM, "--state", str(state)], bind=True)
    assert proc.returncode == gate_code(json.loads(proc.stdout)), proc.stderr
    assert "counter history unavailable" in proc.stderr and "not writable" in proc.stderr
    assert (state / "history.sqlite").read_bytes() == before
