"""The counter history: each run's counters in an embedded SQLite database.

Per-hour rates (uncorrectable FEC blocks per hour, AER errors) need a window
longer than one run's sampling interval. Every ``tailgate inspect`` stores the
counters it read (the facts sampled at t0 and t1) under the user's state
directory (XDG: ``~/.local/state/tailgate/history.sqlite``; ``--state DIR``
overrides) and hands the checks the counters of the *last stored run of the
same host*, so an hourly timer yields true hourly rates.

Theory of operation
-------------------
* One transaction per run, begun with ``BEGIN IMMEDIATE``: it takes SQLite's
  write lock before reading, so concurrent runs queue (busy time-out 30 s)
  instead of interleaving, and each sees a consistent "last run".
* The file is ours only if its header says so: SQLite's ``application_id`` is
  set to :data:`APPLICATION_ID` when we create the schema. An empty file (0 bytes,
  e.g. created a moment ago by a concurrent run) is a new database; anything
  else that is not SQLite, not ours, or fails ``PRAGMA quick_check`` raises
  :class:`HistoryError` and is never written to.
* :func:`growth` picks the window for one counter: the stored run when there is
  one (its length is stated), else the run's own t0..t1 interval. A counter that
  went backwards since the stored run (reboot, driver reload) starts a new
  window instead of yielding a negative rate.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .model import Fact, Snapshot

APPLICATION_ID = 0x74676831  # "tgh1"
SCHEMA_VERSION = 1
KEEP_RUNS = 1000  # per host; an hourly timer keeps about six weeks
FILE_NAME = "history.sqlite"
# Shortest window a rate is computed over: below it a "no growth" says nothing.
MIN_WINDOW_S = 0.5
_SQLITE_MAGIC = b"SQLite format 3\x00"


class HistoryError(ConfigError):
    """The history database cannot be used; the message says why and what to do."""


class HistoryUnavailable(HistoryError):
    """The state directory or database cannot be written (a read-only $HOME, another user's
    directory): inspect runs without the history and says so, rather than refusing."""


def default_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir("tailgate", appauthor=False))


def db_path(state_dir: str | os.PathLike[str] | None) -> Path:
    return Path(state_dir if state_dir is not None else default_dir()) / FILE_NAME


@dataclass(frozen=True)
class StoredRun:
    taken_at: float  # unix time the counters were sampled (the run's t1)
    counters: dict[str, Any]


def _refuse(path: Path, why: str) -> HistoryError:
    return HistoryError(
        f"{path}: {why}; the file was left untouched (move it away, or use --state DIR)")


class HistoryStore:
    """The database at ``path``. Use :meth:`record` once per run."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def _check_header(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HistoryError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block open() and sqlite forever
            raise _refuse(self.path, "not a regular file")
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise _refuse(self.path, "not a regular file")
                head = fh.read(len(_SQLITE_MAGIC))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HistoryError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        if head and head != _SQLITE_MAGIC:
            raise _refuse(self.path, "not a tailgate history database (not an SQLite file)")

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise HistoryUnavailable(f"{self.path.parent}: cannot create: "
                                     f"{exc.strerror or exc}") from exc
        self._check_header()
        for path in (self.path.parent, self.path):
            if os.path.exists(path) and not os.access(path, os.W_OK):
                raise HistoryUnavailable(f"{path}: not writable")
        try:
            return sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryUnavailable(f"{self.path}: cannot open: {exc}") from exc

    def _ensure_schema(self, db: sqlite3.Connection) -> None:
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id == 0 and tables == 0:
            db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, host TEXT NOT NULL, "
                       "taken_at REAL NOT NULL, tailgate TEXT, counters TEXT NOT NULL)")
            db.execute("CREATE INDEX runs_by_host ON runs (host, taken_at)")
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if app_id != APPLICATION_ID:
            raise _refuse(self.path, "an SQLite database that tailgate did not create")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise _refuse(self.path, f"written by a newer tailgate (schema {version})")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise _refuse(self.path, f"corrupt ({check})")

    def record(self, host: str, taken_at: float, counters: dict[str, Any],
               version: str = "") -> StoredRun | None:
        """Store this run; return the previous run of ``host`` (None on its first run)."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            self._ensure_schema(db)
            row = db.execute(
                "SELECT taken_at, counters FROM runs WHERE host = ? "
                "ORDER BY taken_at DESC, id DESC LIMIT 1", (host,)).fetchone()
            db.execute("INSERT INTO runs (host, taken_at, tailgate, counters) VALUES (?, ?, ?, ?)",
                       (host, taken_at, version, json.dumps(counters, sort_keys=True)))
            db.execute(
                "DELETE FROM runs WHERE host = ? AND id NOT IN (SELECT id FROM runs "
                "WHERE host = ? ORDER BY taken_at DESC, id DESC LIMIT ?)", (host, host, KEEP_RUNS))
            db.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            _rollback(db)
            if "readonly" in str(exc) or "read-only" in str(exc):  # a read-only file system
                raise HistoryUnavailable(f"{self.path}: not writable ({exc})") from exc
            raise _refuse(self.path, f"corrupt or unreadable ({exc})") from exc
        except BaseException:
            _rollback(db)
            raise
        finally:
            db.close()
        if row is None:
            return None
        try:
            stored = json.loads(row[1])
        except (TypeError, ValueError) as exc:
            raise _refuse(self.path, f"a stored run is not valid JSON ({exc})") from exc
        if not isinstance(stored, dict):
            raise _refuse(self.path, "a stored run is not a JSON object")
        return StoredRun(taken_at=float(row[0]), counters=stored)

    def runs(self, host: str) -> list[StoredRun]:
        """Every stored run of ``host``, oldest first (for tests and tools)."""
        db = self._connect()
        try:
            self._ensure_schema(db)
            rows = db.execute("SELECT taken_at, counters FROM runs WHERE host = ? "
                              "ORDER BY taken_at, id", (host,)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _refuse(self.path, f"corrupt or unreadable ({exc})") from exc
        finally:
            db.close()
        return [StoredRun(float(t), json.loads(c)) for t, c in rows]


def _rollback(db: sqlite3.Connection) -> None:
    try:
        db.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def sampled_at(snap: Snapshot) -> float:
    """Unix time of the snapshot's t1 sample."""
    return snap.taken_at + snap.interval_s


# Counter facts judged over long windows (by prefix). Others (net.snmp, interrupts, ...)
# are judged over the run's own interval and are not stored: the database stays small
# (a few kB per run) however many CPUs or sockets the host has.
STORED = ("ethtool.fec.", "ethtool.phy.", "pci.aer", "pci.replay")


def counters_of(snap: Snapshot) -> dict[str, Any]:
    """The stored counter facts of a snapshot (sampled at t0 too), as read at t1."""
    return {name: snap.facts[name].value for name in snap.before
            if name.startswith(STORED) and name in snap.facts and snap.facts[name].ok}


def host_key(snap: Snapshot) -> str:
    """The host's name; a host root read under a path (--root) is keyed by name and path, so
    a captured root never shares a history with the live host of the same name."""
    name = str(snap.host.get("hostname") or "unknown")
    root = str(snap.host.get("root") or "/")
    return name if root == "/" else f"{name}@{root}"


def attach_history(snap: Snapshot, state_dir: str | os.PathLike[str] | None) -> Snapshot:
    """Store ``snap``'s counters and put the last stored run's into ``snap.earlier``."""
    store = HistoryStore(db_path(state_dir))
    host = host_key(snap)
    last = store.record(host, sampled_at(snap), counters_of(snap), snap.version)
    if last is not None:
        snap.earlier = {k: Fact(value=v) for k, v in last.counters.items()}
        snap.earlier_at = last.taken_at
    return snap


# ---------------------------------------------------------------- windows


class NoWindow(Exception):
    """No window to compute a counter's growth over; the message says why."""


@dataclass(frozen=True)
class Growth:
    """How much each counter grew, over which window."""

    deltas: dict[str, float]
    window_s: float
    source: str  # "history" (since the last stored run) or "interval" (this run's t0..t1)
    since: float  # unix time the window started
    note: str = ""

    @property
    def per_hour(self) -> dict[str, float]:
        return {k: v * 3600.0 / self.window_s for k, v in self.deltas.items()}

    def describe(self) -> str:
        where = "since the last stored run" if self.source == "history" else "over this run's interval"
        text = f"{self.window_s:.1f} s window {where}"
        return f"{text} ({self.note})" if self.note else text


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON value, by path (``a/b/0``); other leaves are dropped."""
    out: dict[str, float] = {}
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}/{i}" if prefix else str(i)))
    return out


def _pick(fact: Fact | None, pick: Callable[[Any], Any]) -> dict[str, float] | None:
    if fact is None or not fact.ok:
        return None
    try:
        return flatten(pick(fact.value))
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def growth(snap: Snapshot, name: str, pick: Callable[[Any], Any] = lambda v: v) -> Growth:
    """Growth of the counters ``pick(fact value)`` of fact ``name``.

    Prefers the window since the last stored run of this host; a counter that went
    backwards since then (reboot, driver reload) starts a new window, and this
    run's own interval is used instead. Raises :class:`NoWindow` when there is none.
    """
    now = _pick(snap.facts.get(name), pick)
    if now is None:
        raise NoWindow(f"{name}: no current value")
    t1 = sampled_at(snap)
    note = ""
    earlier = _pick(snap.earlier.get(name), pick) if snap.earlier_at is not None else None
    if earlier is not None and snap.earlier_at is not None:
        common = [k for k in now if k in earlier]
        window = t1 - snap.earlier_at
        back = [k for k in common if now[k] < earlier[k]]
        if back:
            note = (f"{back[0] or 'the counter'} went backwards since the last stored run (reset: reboot or "
                    "driver reload); a new window starts with this run")
        elif window <= 0:
            note = "the last stored run is not older than this one (clock moved back)"
        elif window < MIN_WINDOW_S:
            note = f"the last stored run is only {window:.2f} s old"
        elif common:
            return Growth({k: now[k] - earlier[k] for k in common}, window, "history",
                          snap.earlier_at)
    before = _pick(snap.before.get(name), pick)
    if before is not None and snap.interval_s >= MIN_WINDOW_S:
        common = [k for k in now if k in before]
        back = [k for k in common if now[k] < before[k]]
        if back:
            raise NoWindow(f"{name}: {back[0] or 'the counter'} went backwards during the "
                           "interval (counter reset)")
        return Growth({k: now[k] - before[k] for k in common}, snap.interval_s, "interval",
                      snap.taken_at, note)
    if not note:
        note = ("no earlier run of this host in the history store" if snap.earlier_at is None
                else f"{name} was not in the last stored run")
    raise NoWindow(f"no window for a rate: {note}, and the interval ({snap.interval_s:.2f} s) "
                   f"is under {MIN_WINDOW_S:g} s (run again later, e.g. hourly, or use --interval)")
