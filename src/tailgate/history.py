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
* No state file is opened through a link: the state directory must be a real
  directory (not a symlink) owned by us and not world-writable; the database is
  opened ``O_NOFOLLOW`` (a dangling link or a link to a file elsewhere is refused,
  never created or written through) and created ``O_EXCL``; SQLite's side files
  (``-journal``, ``-wal``, ``-shm``) must not be links either.
* What the database holds is input like any other: a stored run whose time stamp
  is not a finite number, or whose counters hold NaN, infinities or negative
  numbers, is not a window; the checks that need it are ``unknown`` with the reason.
* :func:`growth` picks the window for one counter: the stored run when there is
  one (its length is stated), else the run's own t0..t1 interval. A counter that
  went backwards since the stored run (reboot, driver reload) starts a new
  window instead of yielding a negative rate.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sqlite3
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
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
# A time stamp a run could have: a number (not text, blob or NULL) within ±3e10 years.
_SANE_TIME = "(typeof(taken_at) IN ('integer', 'real') AND taken_at BETWEEN -1e18 AND 1e18)"
_MAX_COUNTER = 2**64  # the kernel's counters are u64


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
    # Why this run cannot serve as a window ("" when it can): the whole run, or one counter
    # fact by name. Validated on read: the database may have been edited by anyone.
    bad: str = ""
    bad_facts: dict[str, str] = field(default_factory=dict)


def _refuse(path: Path, why: str) -> HistoryError:
    return HistoryError(
        f"{path}: {why}; the file was left untouched (move it away, or use --state DIR)")


class HistoryStore:
    """The database at ``path``. Use :meth:`record` once per run."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def _check_dir(self) -> None:
        """Create the state directory (0700) or check the one there: a real directory, ours,
        not world-writable, so nobody else can swap a file in it between our checks and use."""
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:  # a read-only $HOME: inspect runs without the history
            raise HistoryUnavailable(f"{parent}: cannot create: {exc.strerror or exc}") from exc
        try:
            st = os.lstat(parent)
        except OSError as exc:
            raise HistoryError(f"{parent}: cannot read: {exc.strerror or exc}") from exc
        if stat.S_ISLNK(st.st_mode):
            raise HistoryError(f"{parent}: the state directory is a symbolic link; tailgate "
                               "writes only into a real directory (use --state DIR)")
        if not stat.S_ISDIR(st.st_mode):
            raise HistoryError(f"{parent}: not a directory (use --state DIR)")
        if st.st_uid != os.geteuid():
            raise HistoryError(f"{parent}: the state directory is owned by uid {st.st_uid}, not "
                               f"by this user (uid {os.geteuid()}); use --state DIR")
        if st.st_mode & stat.S_IWOTH:
            raise HistoryError(f"{parent}: the state directory is world-writable "
                               f"(mode {stat.S_IMODE(st.st_mode):o}); use --state DIR")
        if not os.access(parent, os.W_OK):
            raise HistoryUnavailable(f"{parent}: not writable")

    def _open_file(self) -> None:
        """Open (or create, ``O_EXCL``) the database without following a link and check it is
        a regular file that is ours or empty; SQLite then opens it by the same name."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError:
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:  # a concurrent run created it a moment ago
                    fd = os.open(self.path, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse(self.path, "a symbolic link (tailgate never opens a state file "
                              "through a link)") from exc
            if exc.errno in (errno.ENXIO, errno.EISDIR):
                raise _refuse(self.path, "not a regular file") from exc
            if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise HistoryUnavailable(f"{self.path}: not writable: {exc.strerror}") from exc
            raise HistoryError(f"{self.path}: cannot open: {exc.strerror or exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a FIFO would block sqlite forever
                raise _refuse(self.path, "not a regular file")
            if st.st_nlink != 1:
                raise _refuse(self.path, f"has {st.st_nlink} hard links (one is a file elsewhere)")
            head = os.pread(fd, len(_SQLITE_MAGIC), 0)
        except OSError as exc:
            raise HistoryError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        if head and head != _SQLITE_MAGIC:
            raise _refuse(self.path, "not a tailgate history database (not an SQLite file)")
        for suffix in ("-journal", "-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            try:
                st = os.lstat(side)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise HistoryError(f"{side}: cannot read: {exc.strerror or exc}") from exc
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise _refuse(side, "SQLite's side file is a link or not a regular file")

    def _connect(self) -> sqlite3.Connection:
        self._check_dir()
        self._open_file()
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
            # The run stored last, if its time stamp is not a number, is reported as such
            # (once: this run's row follows it); otherwise the latest by time stamp.
            row = db.execute("SELECT taken_at, counters FROM runs WHERE host = ? "
                             "ORDER BY id DESC LIMIT 1", (host,)).fetchone()
            if row is not None and not _stored_run(row[0], row[1]).bad.startswith("its time"):
                row = db.execute(
                    f"SELECT taken_at, counters FROM runs WHERE host = ? AND {_SANE_TIME} "
                    "ORDER BY taken_at DESC, id DESC LIMIT 1", (host,)).fetchone()
            db.execute("INSERT INTO runs (host, taken_at, tailgate, counters) VALUES (?, ?, ?, ?)",
                       (host, taken_at, version, json.dumps(counters, sort_keys=True)))
            db.execute(  # rows with a broken time stamp go first
                "DELETE FROM runs WHERE host = ? AND id NOT IN (SELECT id FROM runs "
                f"WHERE host = ? ORDER BY ({_SANE_TIME}) DESC, taken_at DESC, id DESC LIMIT ?)",
                (host, host, KEEP_RUNS))
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
        return None if row is None else _stored_run(row[0], row[1])

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
        return [_stored_run(t, c) for t, c in rows]


def _bad_number(value: Any, where: str) -> str:
    """Why a stored counter value is not one tailgate could have written ("" if it is)."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        if isinstance(v, int):
            if not 0 <= v <= _MAX_COUNTER:
                return f"{at} is not a counter ({shorten_repr(v)})"
        elif isinstance(v, float):
            if not math.isfinite(v) or not 0 <= v <= _MAX_COUNTER:
                return f"{at} is {v!r}"
        elif isinstance(v, dict):
            stack.extend((c, f"{at}/{k}") for k, c in v.items())
        elif isinstance(v, list):
            stack.extend((c, f"{at}/{i}") for i, c in enumerate(v))
        else:
            return f"{at} is a {type(v).__name__}"
    return ""


def _stored_run(taken_at: Any, counters: Any) -> StoredRun:
    """One row, validated like any input: a row tailgate could not have written is kept as
    a run that cannot serve as a window, with the reason (never a crash, never a rate)."""
    bad = ""
    if isinstance(taken_at, bool) or not isinstance(taken_at, (int, float)):
        bad = f"its time stamp is not a number ({shorten_repr(taken_at)})"
        when = math.nan
    elif not (math.isfinite(taken_at) and -1e18 <= taken_at <= 1e18):
        bad, when = f"its time stamp is {taken_at!r}", math.nan
    else:
        when = float(taken_at)
    stored: Any = None
    if isinstance(counters, (str, bytes)):
        try:
            stored = json.loads(counters)
        except (TypeError, ValueError) as exc:
            bad = bad or f"its counters are not valid JSON ({exc})"
    if stored is None and not bad:
        bad = "its counters are not a JSON object"
    if not isinstance(stored, dict):
        return StoredRun(when, {}, bad or "its counters are not a JSON object")
    bad_facts = {name: why for name in stored if (why := _bad_number(stored[name], name))}
    return StoredRun(when, stored, bad, bad_facts)


def shorten_repr(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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
STORED = ("ethtool.fec.", "ethtool.phy.", "pci.aer", "pci.replay", "gpu.", "net.pfc.")


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
    if last is None:
        return snap
    if last.bad:
        # No counter of that run can be trusted: every one it should have held is unknown.
        why = f"the last stored run in {store.path} cannot be used: {last.bad}"
        names = set(last.counters) | set(counters_of(snap))
        snap.earlier = {k: Fact(missing=why) for k in sorted(names)}
        snap.earlier_at = None
        return snap
    snap.earlier = {k: (Fact(missing=f"the last stored run in {store.path} cannot be used: "
                                     f"{last.bad_facts[k]}") if k in last.bad_facts else Fact(value=v))
                    for k, v in last.counters.items()}
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
    stored = snap.earlier.get(name)
    if stored is not None and not stored.ok:
        raise NoWindow(f"{name}: {stored.missing}")
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
            return _finite(name, Growth({k: now[k] - earlier[k] for k in common}, window,
                                        "history", snap.earlier_at))
    before = _pick(snap.before.get(name), pick)
    if before is not None and snap.interval_s >= MIN_WINDOW_S:
        common = [k for k in now if k in before]
        back = [k for k in common if now[k] < before[k]]
        if back:
            raise NoWindow(f"{name}: {back[0] or 'the counter'} went backwards during the "
                           "interval (counter reset)")
        return _finite(name, Growth({k: now[k] - before[k] for k in common}, snap.interval_s,
                                    "interval", snap.taken_at, note))
    if not note:
        note = ("no earlier run of this host in the history store" if snap.earlier_at is None
                else f"{name} was not in the last stored run")
    raise NoWindow(f"no window for a rate: {note}, and the interval ({snap.interval_s:.2f} s) "
                   f"is under {MIN_WINDOW_S:g} s (run again later, e.g. hourly, or use --interval)")


def _finite(name: str, g: Growth) -> Growth:
    """``g``, unless a delta or the window is not a finite number: NaN compares false with
    every limit, so "grew by nan" would pass."""
    bad = [k for k, v in g.deltas.items() if not math.isfinite(v)]
    if bad or not math.isfinite(g.window_s):
        what = f"{bad[0] or 'the counter'} grew by {g.deltas[bad[0]]!r}" if bad else "the window"
        raise NoWindow(f"{name}: {what} is not a finite number (a broken sample or stored run)")
    return g
