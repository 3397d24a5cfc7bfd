"""The catalog of red lines and the baseline (their limits), with user overrides.

The catalog ships as ``data/catalog.yaml``: one entry per SPEC.md id with its
layer, red line, unit, default parameters and the text ``explain`` prints. A
user's baseline file overrides parameters per id::

    l2.net.drop_rate: 0.01          # shorthand for {limit: 0.01}
    l2.sched.runqlat: {limit: 300}
    l1.cable.copper_in_rack: {in_rack: [eth2, eth3]}
    l1.clock.ptp: {enabled: false}  # any id: reported as skip, "disabled by the baseline"
    l2.sched.runqlat: {required: true}  # any id: the gate fails unless it is measured
    platform: baremetal             # judge the hardware checks even where a VM is detected

``platform`` (auto, baremetal, vm, container; default auto) says what the host is for the
checks marked ``physical`` in the catalog: on a virtual machine they are skipped, their
hardware belongs to the hypervisor (see :mod:`tailgate.judge`).

Anything wrong in that file (malformed YAML, an unknown id or parameter, a
value of the wrong type) raises :class:`BaselineError` naming file, line and key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from .errors import ConfigError, UsageError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BaselineError(ConfigError):
    pass


PLATFORMS = ("auto", "baremetal", "vm", "container")  # the baseline's `platform` and --platform


@dataclass(frozen=True)
class Entry:
    id: str
    layer: str
    title: str
    unit: str
    params: dict[str, Any]
    rationale: str
    measure: str
    remedy: str
    needs: str = ""  # what it takes to measure it: named in the verdict when it is unknown
    physical: bool = False  # hardware a virtual machine's guest cannot have (skipped there)


@dataclass(frozen=True)
class Baseline:
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = "default"
    disabled: frozenset[str] = frozenset()  # ids switched off with `enabled: false`
    required: frozenset[str] = frozenset()  # ids with `required: true`: unknown or skip fails
    platform: str = "auto"  # what the host is: auto (detected), baremetal, vm or container

    def get(self, check_id: str) -> dict[str, Any]:
        return self.params[check_id]


@lru_cache(maxsize=1)
def catalog() -> dict[str, Entry]:
    text = resources.files("tailgate").joinpath("data/catalog.yaml").read_text(encoding="utf-8")
    raw = yaml.load(text, Loader=_Loader)
    return {
        cid: Entry(
            id=cid,
            layer=e["layer"],
            title=e["title"],
            unit=str(e.get("unit", "")),
            params=dict(e.get("params") or {}),
            rationale=e.get("rationale", ""),
            measure=e.get("measure", ""),
            remedy=e.get("remedy", ""),
            needs=e.get("needs", ""),
            physical=e.get("physical") is True,
        )
        for cid, e in raw.items()
    }


def default_baseline() -> Baseline:
    return Baseline({cid: dict(e.params) for cid, e in catalog().items()})


def _type_ok(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return type(default) is type(value)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value)
    return isinstance(value, type(default))


def _finite(value: Any) -> bool:
    """A NaN limit compares false with everything and would switch a check off unseen."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


MAX_BASELINE_BYTES = 1 * 2**20


def load_baseline(path: str) -> Baseline:
    from .host import shorten
    from .userfiles import UserFileError, compose_yaml, read_user_text

    try:
        root = compose_yaml(read_user_text(path, MAX_BASELINE_BYTES), path)
    except UserFileError as exc:
        raise BaselineError(str(exc)) from exc

    base = default_baseline()
    params = {cid: dict(p) for cid, p in base.params.items()}
    if root is None:
        return Baseline(params, source=path)
    if not isinstance(root, yaml.MappingNode):
        raise BaselineError(f"{path}:{root.start_mark.line + 1}: expected a mapping of check ids")
    known = catalog()
    disabled: set[str] = set()
    required: set[str] = set()
    platform = "auto"
    for key_node, value_node in root.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise BaselineError(f"{path}:{line}: a check id must be a plain key, not a "
                                f"{'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}")
        cid = key_node.value
        if cid == "platform":
            if not isinstance(value_node, yaml.ScalarNode) or value_node.value not in PLATFORMS:
                got = value_node.value if isinstance(value_node, yaml.ScalarNode) else "a collection"
                raise BaselineError(f"{path}:{line}: key platform: expected one of "
                                    f"{', '.join(PLATFORMS)}, got {shorten(repr(got))}")
            platform = value_node.value
            continue
        if cid not in known:
            raise BaselineError(f"{path}:{line}: key {shorten(repr(cid))}: unknown check id "
                                "(see `tailgate checks`)")
        try:
            value = yaml.load(yaml.serialize(value_node), Loader=_Loader)
        except (yaml.YAMLError, ValueError) as exc:  # !!python/object (the safe loader builds
            # no objects), an integer of 5,000 digits
            problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
            raise BaselineError(f"{path}:{line}: key {cid}: {shorten(problem, 120)}") from exc
        if isinstance(value_node, yaml.MappingNode):
            items = []
            for k, v in value_node.value:
                if not isinstance(k, yaml.ScalarNode):
                    raise BaselineError(f"{path}:{k.start_mark.line + 1}: key {cid}: a parameter "
                                        "name must be a plain key")
                items.append((str(k.value), k.start_mark.line + 1, v))
            value_map = {str(k): v for k, v in value.items()}
        else:
            items = [("limit", line, value_node)]
            value_map = {"limit": value}
        for name, pline, _node in items:
            where = f"{path}:{pline}: key {cid}.{shorten(name, 40)}"
            if name == "enabled":
                if not isinstance(value_map[name], bool):
                    raise BaselineError(f"{where}: expected true or false, got "
                                        f"{shorten(repr(value_map[name]))}")
                (disabled.discard if value_map[name] else disabled.add)(cid)
                continue
            if name == "required":
                if not isinstance(value_map[name], bool):
                    raise BaselineError(f"{where}: expected true or false, got {value_map[name]!r}")
                (required.add if value_map[name] else required.discard)(cid)
                continue
            if name not in params[cid]:
                allowed = ", ".join(sorted([*params[cid], "enabled", "required"]))
                raise BaselineError(f"{where}: unknown parameter (allowed: {allowed})")
            default, new = params[cid][name], value_map[name]
            if not _type_ok(default, new):
                raise BaselineError(
                    f"{where}: expected {type(default).__name__}, got {type(new).__name__} "
                    f"{shorten(repr(new))}")
            if not _finite(new):
                raise BaselineError(f"{where}: expected a finite number, got {new!r}")
            params[cid][name] = new
    both = sorted(disabled & required)
    if both:
        raise BaselineError(f"{path}: {', '.join(both)}: both required and disabled "
                            "(enabled: false): a required id must be measured")
    return Baseline(params, source=path, disabled=frozenset(disabled),
                    required=frozenset(required), platform=platform)


def required_ids(ids: list[str], baseline: Baseline) -> list[str]:
    """The ids the gate requires measured: ``--require`` ids (each checked against the catalog
    and the baseline) and the baseline's own, in catalog order."""
    for cid in ids:
        if cid not in catalog():
            raise UsageError(f"--require {cid}: unknown check id (see `tailgate checks`)")
        if cid in baseline.disabled:
            raise UsageError(f"--require {cid}: disabled by the baseline ({baseline.source})")
    return [cid for cid in catalog() if cid in baseline.required or cid in ids]
