"""cgroup facts."""

from __future__ import annotations


def resolve_cgroup(host, spec):  # replaced below with the real resolver
    return spec if host.exists(spec) else None
