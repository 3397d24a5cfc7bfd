"""`--scenario FILE.yaml`: several bench targets run at once, each with its own options (pure).

A scenario is the "mixed peak" of the method: e.g. TCP sessions and HTTP
requests together, each gated on its own SLOs, one verdict for all::

    # every key of `defaults` applies to each target that does not set it
    defaults:
      duration: 10s
      connections: 4
    targets:
      - name: web                    # optional; default: the url
        url: http://10.0.0.1:8080/
        rate: 2000
        slo: ["p99<5ms", "error_rate<0.1%"]
      - name: cache
        url: tcp://10.0.0.1:6379
        rate: 1000
        payload: "PING\\r\\n"
        delimiter: "\\r\\n"

A target's keys are the bench's own options (the long option without ``--``;
``-`` or ``_`` alike; ``slo`` and ``header`` take a list). Options given on the
command line are the defaults of every target. Every error names the file, the
line and the key (PyYAML marks), as the baseline's do.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import ConfigError, UsageError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_SCENARIO_BYTES = 1 << 20
MAX_TARGETS = 64

# option -> the type its YAML value must have (str options also take numbers: `rate: 2000`)
KEYS: dict[str, type | tuple[type, ...]] = {
    "url": str, "name": str,
    "rate": (str, int, float), "duration": (str, int, float), "warmup": (str, int, float),
    "coalesce": (str, int, float),
    "arrival": str, "burstiness": (int, float), "connections": int, "max_connections": int, "workers": int,
    "timeout": (str, int, float), "seed": int, "min_tail_samples": int,
    "slo": list, "method": str, "header": list, "body": str, "body_file": str,
    "payload": str, "delimiter": str, "response_length": int, "retry_stale": bool,
    "max_header_bytes": (str, int), "max_body_bytes": (str, int),
    "max_event_bytes": (str, int), "max_tokens_per_stream": int,
    # openai+ targets (LLM streams)
    "model": str, "api": str, "workload": str, "input_len": int, "output_len": int,
    "requests": int,
    # udp:// targets (datagrams)
    "size": (str, int), "batch": int, "io": str,
}
LISTS = ("slo", "header")


class ScenarioError(ConfigError):
    """A scenario file that cannot be used (file:line: key: why)."""


@dataclass
class ScenarioTarget:
    """One target of a scenario: its name, the line it starts on, its options."""

    name: str
    line: int
    options: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)  # option -> line, for errors

    def where(self, path: str, key: str | None = None) -> str:
        line = self.lines.get(key, self.line) if key else self.line
        return f"{path}:{line}: target {self.name!r}" + (f", key {key}" if key else "")


def _value(node: yaml.Node, path: str, what: str) -> Any:
    try:
        return yaml.load(yaml.serialize(node), Loader=_Loader)
    except (yaml.YAMLError, ValueError) as exc:
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
        raise ScenarioError(f"{path}:{node.start_mark.line + 1}: {what}: {problem}") from exc


def options_of(mapping: yaml.Node, path: str, what: str) -> tuple[dict[str, Any], dict[str, int]]:
    if not isinstance(mapping, yaml.MappingNode):
        raise ScenarioError(f"{path}:{mapping.start_mark.line + 1}: {what}: expected a mapping "
                            "of options (url: ..., rate: ...)")
    opts: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for k, v in mapping.value:
        line = k.start_mark.line + 1
        if not isinstance(k, yaml.ScalarNode):
            raise ScenarioError(f"{path}:{line}: {what}: a key must be a plain name")
        key = str(k.value).replace("-", "_")
        if key not in KEYS:
            raise ScenarioError(f"{path}:{line}: {what}, key {k.value}: unknown key (allowed: "
                                f"{', '.join(sorted(KEYS))})")
        if key in opts:
            raise ScenarioError(f"{path}:{line}: {what}, key {k.value}: given twice")
        val = _value(v, path, f"{what}, key {key}")
        want = KEYS[key]
        if key in LISTS and isinstance(val, str):
            val = [val]
        ok = isinstance(val, want) and not (isinstance(val, bool) and want is not bool
                                            and bool not in (want if isinstance(want, tuple)
                                                             else (want,)))
        if ok and key in LISTS:
            ok = all(isinstance(x, str) for x in val)
        if not ok:
            names = " or ".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
            if key in LISTS:
                names = "a list of strings"
            raise ScenarioError(f"{path}:{line}: {what}, key {key}: expected {names}, got "
                                f"{type(val).__name__} {str(val)[:60]!r}")
        opts[key], lines[key] = val, line
    return opts, lines


def parse_scenario(text: str, path: str) -> list[ScenarioTarget]:
    """The targets of a scenario document, defaults applied; ScenarioError when malformed."""
    from ..userfiles import UserFileError, compose_yaml

    try:
        root = compose_yaml(text, path)
    except UserFileError as exc:
        raise ScenarioError(str(exc)) from exc
    if root is None:
        raise ScenarioError(f"{path}: empty scenario (expected `targets:` with a list)")
    if not isinstance(root, yaml.MappingNode):
        raise ScenarioError(f"{path}:{root.start_mark.line + 1}: expected a mapping with "
                            "`targets:` (and optionally `defaults:`)")
    top = {}
    for k, v in root.value:
        name = getattr(k, "value", None)
        if name not in ("targets", "defaults"):
            raise ScenarioError(f"{path}:{k.start_mark.line + 1}: key {name}: unknown key "
                                "(allowed: defaults, targets)")
        top[name] = (k, v)
    if "targets" not in top:
        raise ScenarioError(f"{path}: no `targets:` list")
    defaults, dlines = ({}, {})
    if "defaults" in top:
        defaults, dlines = options_of(top["defaults"][1], path, "defaults")
        for bad in ("url", "name"):
            if bad in defaults:
                raise ScenarioError(f"{path}:{dlines[bad]}: defaults, key {bad}: belongs to "
                                    "one target")
    seq = top["targets"][1]
    if not isinstance(seq, yaml.SequenceNode) or not seq.value:
        raise ScenarioError(f"{path}:{seq.start_mark.line + 1}: key targets: expected a "
                            "non-empty list of targets")
    if len(seq.value) > MAX_TARGETS:
        raise ScenarioError(f"{path}:{seq.start_mark.line + 1}: key targets: more than "
                            f"{MAX_TARGETS} targets")
    out: list[ScenarioTarget] = []
    for i, node in enumerate(seq.value):
        opts, lines = options_of(node, path, f"targets[{i}]")
        line = node.start_mark.line + 1
        if "url" not in opts:
            raise ScenarioError(f"{path}:{line}: targets[{i}]: no `url:` key")
        name = opts.pop("name", None) or opts["url"]
        if any(t.name == name for t in out):
            raise ScenarioError(f"{path}:{lines.get('name', line)}: targets[{i}], key name: "
                                f"{name!r} is used twice (name each target)")
        merged_opts = {**defaults, **opts}
        merged_lines = {**dlines, **lines}
        out.append(ScenarioTarget(name, line, merged_opts, merged_lines))
    return out


def load_scenario(path: str) -> list[ScenarioTarget]:
    from ..userfiles import UserFileError, read_user_text

    try:
        text = read_user_text(path, MAX_SCENARIO_BYTES)
    except UserFileError as exc:
        raise ScenarioError(f"--scenario: {exc}") from exc
    return parse_scenario(text, path)


def target_args(base: argparse.Namespace, t: ScenarioTarget) -> argparse.Namespace:
    """The command line's options with this target's on top, as `bench TARGET` would parse."""
    ns = argparse.Namespace(**vars(base))
    ns.target = t.options["url"]
    if base.workers is None and "workers" not in t.options:
        ns.workers = 1  # one process per target unless asked: targets run side by side
    for key, val in t.options.items():
        if key == "url":
            continue
        if key in LISTS:
            val = list(val)
        elif isinstance(val, (int, float)) and not isinstance(val, bool) \
                and key not in ("connections", "max_connections", "workers", "seed",
                                "min_tail_samples", "response_length", "input_len",
                                "output_len", "requests", "burstiness", "batch"):
            val = str(val)  # "rate: 2000" is the text "2000", parsed like the command line
        if key == "burstiness":
            val = float(val)
        setattr(ns, key, val)
    return ns


def check_key(t: Any, path: str) -> None:
    """Per-key checks, so an error names the key's own line."""
    from ..slo import SloError, parse_slo
    from .schedule import ARRIVALS, parse_ramp
    from .spec import parse_size
    from .target import TargetError, parse_header
    from .units import parse_duration, parse_rate

    def rate_or_ramp(text: str) -> None:
        if parse_ramp(text) is None:
            parse_rate(text)

    checks = {"rate": rate_or_ramp, "duration": parse_duration, "warmup": parse_duration,
              "coalesce": parse_duration, "timeout": parse_duration, "max_header_bytes": parse_size,
              "max_body_bytes": parse_size, "max_event_bytes": parse_size}
    llm = str(t.options.get("url", "")).startswith("openai+")
    for key, val in t.options.items():
        try:
            if key in checks:
                checks[key](str(val))
            elif key == "slo" and not llm:  # LLM SLOs (ttft_p99...) are the engine's to parse
                for e in val:
                    parse_slo(e)
            elif key == "header":
                for h in val:
                    parse_header(h)
            elif key == "arrival" and val not in ARRIVALS:
                raise ValueError(f"expected {', '.join(ARRIVALS[:-1])} or {ARRIVALS[-1]}, "
                                 f"not {val!r}")
            elif key == "burstiness" and not 1e-3 <= float(val) <= 1e3:
                raise ValueError(f"expected a gamma shape between 0.001 and 1000, not {val!r}")
        except (ValueError, SloError, TargetError) as exc:
            raise UsageError(f"{t.where(path, key)}: {exc}") from None
