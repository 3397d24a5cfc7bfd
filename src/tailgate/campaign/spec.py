"""The campaign file: one system under test, measured by every layer's command (pure).

A campaign names what `tailgate campaign run` measures, in the order it runs it::

    name: web-tier                  # optional; default: the file's stem
    service:                        # the latency-critical service (optional)
      pids: [1234]                  #   its processes, or
      cgroup: /sys/fs/cgroup/cpu/web  # its cgroup (a directory, or a path in the cpu hierarchy)
      iface: [eth0]                 #   its interfaces (default: every non-loopback one)
    inspect:                        # step 1: `tailgate inspect` (always runs)
      interval: 5                   #   seconds between the two counter samples (default 5)
      probe_window: 10              #   seconds of eBPF probes (default: no probes)
      baseline: baseline.yaml       #   red lines; a relative path is from this file
      dpdk: [pmd0]                  #   DPDK --file-prefix values
      memory_stats: gpu-memory.json #   torch.cuda.memory_stats() as JSON
      engine: http://127.0.0.1:8000/metrics
    loads:                          # step 2..: `tailgate bench`, one per target
      - name: web                   #   keys: the bench's own options, as in a scenario
        url: http://127.0.0.1:8080/
        rate: 2000
        duration: 10s
        slo: ["p99<5ms"]
    collective: --backend mpi --ranks 4 --sizes 1MiB --iters 500  # last: `bench allreduce`
    diagnose: true                  # a load that misses its SLO is diagnosed (needs service)
    ray: auto                       # inspect and loads run over this Ray cluster
    timeout: 15m                    # per step (default 15m); a step past it is killed

Every error names the file, the line and the key, and exits 2 (like the baseline's and the
scenario's). A campaign with ``ray`` names no one host's things (service, dpdk,
memory_stats, diagnose), as `inspect --ray` refuses them.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import ConfigError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_CAMPAIGN_BYTES = 1 << 20
MAX_LOADS = 32
DEFAULT_TIMEOUT_S = 900.0

TOP = ("name", "service", "inspect", "loads", "collective", "diagnose", "ray", "timeout")
SERVICE = ("pids", "cgroup", "iface")
INSPECT = ("interval", "probe_window", "baseline", "dpdk", "memory_stats", "engine", "during")


class CampaignError(ConfigError):
    """A campaign file that cannot be used (file:line: key: why); exit status 2."""


@dataclass(frozen=True)
class Load:
    """One load target: its name and the bench options (the scenario keys), with their lines."""

    name: str
    line: int
    options: dict[str, Any]
    lines: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Campaign:
    path: str
    name: str
    pids: tuple[int, ...] = ()
    cgroup: str | None = None
    ifaces: tuple[str, ...] = ()
    interval_s: float = 5.0
    probe_window_s: float | None = None
    baseline: str | None = None  # absolute path
    dpdk: tuple[str, ...] = ()
    memory_stats: str | None = None  # absolute path
    engine: str | None = None
    loads: tuple[Load, ...] = ()
    collective: tuple[str, ...] | None = None  # `tailgate bench allreduce` arguments
    launcher: tuple[str, ...] = ()  # e.g. mpirun -np 4 (`tailgate` then runs as python -m)
    launcher_runs_module: bool = False  # torchrun ... -m tailgate: the launcher names it
    inspect_during: str | None = None  # a load's name: inspect runs while that load runs
    diagnose: bool = False
    ray: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    lines: dict[str, int] = field(default_factory=dict)  # key -> line, for later errors

    def where(self, key: str) -> str:
        return f"{self.path}:{self.lines.get(key, 1)}: key {key}"


def _err(path: str, node: yaml.Node, key: str, why: str) -> CampaignError:
    return CampaignError(f"{path}:{node.start_mark.line + 1}: key {key}: {why}")


def _value(node: yaml.Node, path: str, key: str) -> Any:
    try:
        return yaml.load(yaml.serialize(node), Loader=_Loader)
    except (yaml.YAMLError, ValueError) as exc:
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
        raise _err(path, node, key, problem) from exc


def _mapping(node: yaml.Node, path: str, what: str,
             allowed: tuple[str, ...]) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise _err(path, node, what, "expected a mapping")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        name = k.value if isinstance(k, yaml.ScalarNode) else None
        full = f"{what}.{name}" if what else str(name)
        if name not in allowed:
            raise _err(path, k, full, f"unknown key (allowed: {', '.join(allowed)})")
        if name in out:
            raise _err(path, k, full, "given twice")
        out[name] = (k, v)
    return out


def _number(node: yaml.Node, path: str, key: str, hi: float, zero: bool = False) -> float:
    """Seconds in (0, hi] (or 0 when ``zero``): a number, or a duration such as ``10s``."""
    val = _value(node, path, key)
    if isinstance(val, str):
        from ..bench.units import parse_duration

        try:
            val = parse_duration(val)
        except ValueError as exc:
            raise _err(path, node, key, str(exc)) from None
    ok = not isinstance(val, bool) and isinstance(val, (int, float)) and (
        0 < val <= hi or (zero and val == 0))
    if not ok:
        low = "[0" if zero else "(0"
        raise _err(path, node, key, f"expected seconds in {low}, {hi:g}], got {str(val)[:60]!r}")
    return float(val)


def _str_list(node: yaml.Node, path: str, key: str) -> list[str]:
    val = _value(node, path, key)
    if isinstance(val, (str, int)) and not isinstance(val, bool):
        val = [val]
    if not isinstance(val, list) or not val or not all(
            isinstance(x, (str, int)) and not isinstance(x, bool) for x in val):
        raise _err(path, node, key, "expected a value or a non-empty list of values")
    return [str(x) for x in val]


def _file(node: yaml.Node, path: str, key: str) -> str:
    val = _value(node, path, key)
    if not isinstance(val, str) or not val:
        raise _err(path, node, key, "expected a file name")
    full = val if os.path.isabs(val) else os.path.join(os.path.dirname(os.path.abspath(path)),
                                                         val)
    if not os.path.isfile(full):
        raise _err(path, node, key, f"no such file: {full}")
    return os.path.abspath(full)


def _service(node: yaml.Node, path: str, out: dict[str, Any]) -> None:
    from ..host import valid_iface, valid_pid

    m = _mapping(node, path, "service", SERVICE)
    if "pids" in m:
        k, v = m["pids"]
        try:
            out["pids"] = tuple(dict.fromkeys(valid_pid(str(p)) for p in
                                              _str_list(v, path, "service.pids")))
        except ValueError as exc:
            raise _err(path, v, "service.pids", str(exc)) from None
        out["lines"]["pids"] = k.start_mark.line + 1
    if "cgroup" in m:
        k, v = m["cgroup"]
        val = _value(v, path, "service.cgroup")
        if not isinstance(val, str) or not val:
            raise _err(path, v, "service.cgroup", "expected a cgroup path")
        out["cgroup"] = val
        out["lines"]["cgroup"] = k.start_mark.line + 1
    if "iface" in m:
        k, v = m["iface"]
        try:
            out["ifaces"] = tuple(valid_iface(i) for i in _str_list(v, path, "service.iface"))
        except ValueError as exc:
            raise _err(path, v, "service.iface", str(exc)) from None


def _inspect(node: yaml.Node, path: str, out: dict[str, Any]) -> None:
    m = _mapping(node, path, "inspect", INSPECT)
    for key, (k, v) in m.items():
        full = f"inspect.{key}"
        out["lines"][key] = k.start_mark.line + 1
        if key == "interval":
            out["interval_s"] = _number(v, path, full, 3600, zero=True)
        elif key == "probe_window":
            out["probe_window_s"] = _number(v, path, full, 3600)
        elif key == "baseline":
            out["baseline"] = _file(v, path, full)
            from ..baseline import load_baseline

            load_baseline(out["baseline"])  # its own errors name its own file and line
        elif key == "memory_stats":
            out["memory_stats"] = _file(v, path, full)
        elif key == "dpdk":
            from ..sources.dpdk import valid_prefix

            try:
                out["dpdk"] = tuple(valid_prefix(p) for p in _str_list(v, path, full))
            except ValueError as exc:
                raise _err(path, v, full, str(exc)) from None
        elif key == "during":
            val = _value(v, path, full)
            if not isinstance(val, str) or not val:
                raise _err(path, v, full, "expected the name of a load")
            out["inspect_during"] = val
        elif key == "engine":
            val = _value(v, path, full)
            if not isinstance(val, str) or not val.startswith(("http://", "https://")):
                if not isinstance(val, str) or not val:
                    raise _err(path, v, full, "expected an http(s):// URL or a scrape file")
                out["engine"] = _file(v, path, full)
            else:
                out["engine"] = val


def _loads(node: yaml.Node, path: str) -> tuple[Load, ...]:
    from ..bench.scenario import ScenarioError, ScenarioTarget, check_key, options_of

    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise _err(path, node, "loads", "expected a non-empty list of load targets")
    if len(node.value) > MAX_LOADS:
        raise _err(path, node, "loads", f"more than {MAX_LOADS} load targets")
    out: list[Load] = []
    for i, item in enumerate(node.value):
        try:  # the scenario's own validation: every bench option with its type and line
            opts, lines = options_of(item, path, f"loads[{i}]")
        except ScenarioError as exc:
            raise CampaignError(str(exc)) from None
        line = item.start_mark.line + 1
        if "url" not in opts:
            raise CampaignError(f"{path}:{line}: loads[{i}]: no `url:` key")
        name = str(opts.pop("name", None) or opts["url"])
        if any(x.name == name for x in out):
            raise CampaignError(f"{path}:{lines.get('name', line)}: loads[{i}], key name: "
                                f"{name!r} is used twice (name each load)")
        t = ScenarioTarget(name, line, opts, lines)
        from ..errors import UsageError

        try:
            check_key(t, path)  # values: rates, durations, SLOs, headers
        except UsageError as exc:
            raise CampaignError(str(exc)) from None
        if "duration" not in opts and not (str(opts["url"]).startswith("openai+")
                                           and "requests" in opts):
            raise CampaignError(f"{path}:{line}: loads[{i}] {name!r}: no `duration:` key "
                                "(every load is bounded in time)")
        if "body_file" in opts and not os.path.isabs(opts["body_file"]):  # steps run elsewhere
            opts["body_file"] = os.path.join(os.path.dirname(os.path.abspath(path)),
                                             opts["body_file"])
        out.append(Load(name, line, opts, lines))
    return tuple(out)


def _collective(node: yaml.Node, path: str, out: dict[str, Any]) -> None:
    """`[LAUNCHER ...] tailgate bench allreduce ARGS`, or ARGS alone (one process)."""
    val = _value(node, path, "collective")
    if isinstance(val, str):
        try:
            argv = shlex.split(val)
        except ValueError as exc:
            raise _err(path, node, "collective", f"not a command line: {exc}") from None
    elif isinstance(val, list) and all(isinstance(x, (str, int, float)) and
                                       not isinstance(x, bool) for x in val):
        argv = [str(x) for x in val]
    else:
        raise _err(path, node, "collective", "expected the `tailgate bench allreduce` "
                   "command line (with its launcher), as one line or a list")
    at = next((i for i in range(len(argv)) if argv[i:i + 3] == ["tailgate", "bench",
                                                               "allreduce"]), None)
    if at is not None:
        launcher, argv = argv[:at], argv[at + 3:]
        out["launcher_runs_module"] = bool(launcher) and launcher[-1] == "-m"
        out["launcher"] = tuple(launcher[:-1] if out["launcher_runs_module"] else launcher)
        if out["launcher"] and shutil.which(out["launcher"][0]) is None:
            raise _err(path, node, "collective", f"launcher {out['launcher'][0]!r} not found")
    elif argv[:2] == ["bench", "allreduce"]:
        argv = argv[2:]
    elif argv[:1] == ["allreduce"]:
        argv = argv[1:]
    for bad in ("--json", "--html", "--hdr"):
        if any(a == bad or a.startswith(bad + "=") for a in argv):
            raise _err(path, node, "collective", f"{bad}: the campaign writes the documents")
    from ..bench.collective.command import build_parser

    parser = build_parser()
    parser.exit_on_error = False
    try:  # argparse's own check of the collective's options, as the command will see them
        _, unknown = parser.parse_known_args(argv)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - argparse raises either
        raise _err(path, node, "collective", f"{exc or 'bad arguments'}") from None
    if unknown:
        raise _err(path, node, "collective", f"unknown arguments: {' '.join(unknown)}")
    out["collective"] = tuple(argv)


def parse_campaign(text: str, path: str) -> Campaign:
    """The campaign in ``text`` (read from ``path``), checked; CampaignError when malformed."""
    from ..userfiles import UserFileError, compose_yaml

    try:
        root = compose_yaml(text, path)
    except UserFileError as exc:
        raise CampaignError(str(exc)) from exc
    if root is None:
        raise CampaignError(f"{path}: empty campaign (expected a mapping with `loads:` or "
                            "`inspect:`)")
    m = _mapping(root, path, "", TOP)
    out: dict[str, Any] = {"lines": {k: kv[0].start_mark.line + 1 for k, kv in m.items()}}
    name = os.path.splitext(os.path.basename(path))[0]
    if "name" in m:
        name = _value(m["name"][1], path, "name")
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise _err(path, m["name"][1], "name", "expected a short text")
    if "service" in m:
        _service(m["service"][1], path, out)
    if "inspect" in m:
        _inspect(m["inspect"][1], path, out)
    if "loads" in m:
        out["loads"] = _loads(m["loads"][1], path)
    if "collective" in m:
        _collective(m["collective"][1], path, out)
    during = out.get("inspect_during")
    if during is not None:
        load = next((x for x in out.get("loads", ()) if x.name == during), None)
        where = f"{path}:{out['lines']['during']}: key inspect.during"
        if load is None:
            raise CampaignError(f"{where}: no load named {during!r}")
        from ..bench.units import parse_duration

        need = out.get("interval_s", 5.0) + (out.get("probe_window_s") or 0) + 2
        have = parse_duration(str(load.options.get("duration", "0")))
        if have < need:
            raise CampaignError(f"{where}: load {during!r} lasts {have:g} s, less than the "
                                f"inspection's interval and probe window + 2 s ({need:g} s)")
    if "diagnose" in m:
        val = _value(m["diagnose"][1], path, "diagnose")
        if not isinstance(val, bool):
            raise _err(path, m["diagnose"][1], "diagnose", "expected true or false")
        if val and not (out.get("pids") or out.get("cgroup")):
            raise _err(path, m["diagnose"][1], "diagnose", "needs the service (service.pids "
                       "or service.cgroup): its threads are what diagnose probes")
        out["diagnose"] = val
    if "ray" in m:
        val = _value(m["ray"][1], path, "ray")
        if not isinstance(val, str) or not val:
            raise _err(path, m["ray"][1], "ray", "expected HOST:PORT of the head, or auto")
        for own in ("pids", "cgroup", "dpdk", "memory_stats"):
            if out.get(own):
                raise _err(path, m["ray"][1], "ray", f"{own} names one host's things: not with "
                           "ray (as `inspect --ray` refuses them)")
        if out.get("diagnose"):
            raise _err(path, m["ray"][1], "ray", "diagnose runs on one host: not with ray")
        out["ray"] = val
    if "timeout" in m:
        out["timeout_s"] = _number(m["timeout"][1], path, "timeout", 86400)
    return Campaign(path=path, name=name, **out)


def load_campaign(path: str) -> Campaign:
    from ..userfiles import UserFileError, read_user_text

    try:
        text = read_user_text(path, MAX_CAMPAIGN_BYTES)
    except UserFileError as exc:
        raise CampaignError(str(exc)) from exc
    return parse_campaign(text, path)
