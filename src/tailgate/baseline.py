"""The catalog of red lines and the baseline (their limits), with user overrides.

The catalog ships as ``data/catalog.yaml``: one entry per SPEC.md id with its
layer, red line, unit, default parameters and the text ``explain`` prints. A
user's baseline file overrides parameters per id::

    l2.net.drop_rate: 0.01          # shorthand for {limit: 0.01}
    l2.sched.runqlat: {limit: 300}
    l1.cable.copper_in_rack: {in_rack: [eth2, eth3]}
    l1.clock.ptp: {enabled: false}  # any id: reported as skip, "disabled by the baseline"
    l2.sched.runqlat: {required: true}  # any id: the gate fails unless it is measured

Anything wrong in that file (malformed YAML, an unknown id or parameter, a
value of the wrong type) raises :class:`BaselineError` naming file, line and key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from .errors import ConfigError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BaselineError(ConfigError):
    pass


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


@dataclass(frozen=True)
class Baseline:
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = "default"
    disabled: frozenset[str] = frozenset()  # ids switched off with `enabled: false`
    required: frozenset[str] = frozenset()  # ids with `required: true`: unknown or skip fails

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


def load_baseline(path: str) -> Baseline:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise BaselineError(f"{where}: malformed YAML: {getattr(exc, 'problem', exc)}") from exc

    base = default_baseline()
    params = {cid: dict(p) for cid, p in base.params.items()}
    if root is None:
        return Baseline(params, source=path)
    if not isinstance(root, yaml.MappingNode):
        raise BaselineError(f"{path}:{root.start_mark.line + 1}: expected a mapping of check ids")
    known = catalog()
    disabled: set[str] = set()
    required: set[str] = set()
    for key_node, value_node in root.value:
        cid = key_node.value
        line = key_node.start_mark.line + 1
        if cid not in known:
            raise BaselineError(f"{path}:{line}: key {cid!r}: unknown check id (see `tailgate checks`)")
        value = yaml.load(yaml.serialize(value_node), Loader=_Loader)
        if isinstance(value_node, yaml.MappingNode):
            items = [(k.value, k.start_mark.line + 1, v) for k, v in value_node.value]
            value_map = value
        else:
            items = [("limit", line, value_node)]
            value_map = {"limit": value}
        for name, pline, _node in items:
            where = f"{path}:{pline}: key {cid}.{name}"
            if name == "enabled":
                if not isinstance(value_map[name], bool):
                    raise BaselineError(f"{where}: expected true or false, got {value_map[name]!r}")
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
                    f"{where}: expected {type(default).__name__}, got {type(new).__name__} {new!r}"
                )
            params[cid][name] = new
    both = sorted(disabled & required)
    if both:
        raise BaselineError(f"{path}: {', '.join(both)}: both required and disabled "
                            "(enabled: false): a required id must be measured")
    return Baseline(params, source=path, disabled=frozenset(disabled),
                    required=frozenset(required))
