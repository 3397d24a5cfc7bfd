"""The service a command watches, named by ``--pid`` and ``--cgroup``: checked against the
host it runs on. Every error here is a :class:`~tailgate.errors.UsageError` (exit status 2).
"""

from __future__ import annotations

from .errors import UsageError


def existing_pids(host, values: list[str]) -> tuple[int, ...]:
    """--pid values as integers of processes that exist on ``host`` (duplicates dropped)."""
    from .host import PID_MAX_LIMIT, valid_pid
    from .model import SourceError

    try:  # the host's own ceiling; the kernel's when it cannot be read
        pid_max = int(host.read("/proc/sys/kernel/pid_max").strip())
        pid_max = pid_max if 0 < pid_max <= PID_MAX_LIMIT else PID_MAX_LIMIT
    except (SourceError, ValueError):
        pid_max = PID_MAX_LIMIT
    try:
        pids = tuple(dict.fromkeys(valid_pid(v, pid_max) for v in values))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    for pid in pids:
        try:
            present = host.exists(f"/proc/{pid}")
        except SourceError as exc:
            raise UsageError(f"--pid {pid}: {exc}") from exc
        if not present:
            raise UsageError(f"no such process: --pid {pid}")
    return pids


def existing_cgroup(host, spec: str) -> str:
    """--cgroup as the absolute directory of an existing cgroup on ``host``."""
    from .model import SourceError
    from .sources.cgroup import resolve_cgroup

    try:
        path = resolve_cgroup(host, spec)
    except (SourceError, ValueError) as exc:
        raise UsageError(f"--cgroup: {exc}") from exc
    if path is None:
        raise UsageError(f"no such cgroup: --cgroup {spec}")
    return path
