"""Files a user hands tailgate (``--from``, ``--baseline``, ``--memory-stats``): bounded.

Such a file may be anything: a FIFO that never ends, a link to ``/dev/zero``, a
gigabyte, Latin-1, JSON nested a million deep. Each is read only if it is a
regular file under a size cap, decoded as strict UTF-8, and parsed under a depth
cap; anything else is a :class:`UserFileError` whose one-line message names the
file and what is wrong (exit status 2).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import yaml

from .errors import InputError
from .host import TooLarge, read_regular, shorten
from .model import SourceError

MAX_SNAPSHOT_BYTES = 64 * 2**20  # a snapshot of a big host is a few MiB
MAX_DEPTH = 64  # a snapshot nests ~8 deep; a baseline 3


class UserFileError(InputError):
    """A user's file that cannot be used; the message names it."""


YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_YAML_DEPTH = 16  # a baseline nests 3 deep, a scenario or campaign 5
MAX_YAML_NODES = 10_000  # nodes after alias expansion: a "billion laughs" file stops here


def compose_yaml(text: str, path: str) -> yaml.Node | None:
    """The node graph of a user's YAML document (lines kept, for errors naming them), or None
    for an empty one: nesting deeper than MAX_YAML_DEPTH, an alias bomb or a recursive alias
    is refused before anything is built from it. Every YAML file a user hands tailgate
    (baseline, scenario, campaign, web config) is read through here."""
    try:
        _bounded(text, path)
        root = yaml.compose(text, Loader=YAML_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise UserFileError(f"{where}: malformed YAML: {getattr(exc, 'problem', None) or exc}"
                            ) from exc
    if root is not None:
        _expanded_size(root, path)
    return root


def _bounded(text: str, path: str) -> None:
    """Refuse deep nesting from the event stream (flat: nothing recurses on it yet)."""
    depth = 0
    for event in yaml.parse(text, Loader=YAML_LOADER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                line = event.start_mark.line + 1
                raise UserFileError(f"{path}:{line}: nested deeper than {MAX_YAML_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _expanded_size(root: yaml.Node, path: str) -> int:
    """Nodes of the document with every alias expanded, computed on the shared graph
    (memoised, so a bomb costs its own size to measure, not its expansion)."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = ([c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode)
                    else list(node.value))
        if done:
            sizes[id(node)] = min(1 + sum(sizes.get(id(c), MAX_YAML_NODES) for c in children),
                                  MAX_YAML_NODES + 1)
            visiting.discard(id(node))
            continue
        if id(node) in visiting:
            raise UserFileError(f"{path}:{node.start_mark.line + 1}: an alias refers to a node "
                                "that contains it (a recursive structure)")
        visiting.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    total = sizes[id(root)]
    if total > MAX_YAML_NODES:
        raise UserFileError(f"{path}: more than {MAX_YAML_NODES} values once its aliases are "
                            "expanded (an alias bomb?)")
    return total


def read_user_text(path: str, limit: int) -> str:
    """The text of the regular file ``path`` (symlinks followed: it is the user's own path)."""
    try:
        data = read_regular(os.path.realpath(path), limit, what=path)
    except TooLarge as exc:
        raise UserFileError(str(exc)) from exc
    except SourceError as exc:
        raise UserFileError(f"cannot read {exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from exc


def _no_constant(name: str) -> Any:
    raise UserFileError(f"non-finite number {name} (JSON has none)")


def depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, without recursion; stops once past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def load_json(path: str, limit: int = MAX_SNAPSHOT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    from .model import ParseError
    from .sources.records import unique_pairs

    text = read_user_text(path, limit)
    try:
        # A key twice in one object: which value is meant cannot be told (JSON's own rule,
        # the last one wins, would pick one silently).
        data = json.loads(text, parse_constant=_no_constant,
                          object_pairs_hook=unique_pairs("JSON object key"))
    except (UserFileError, ParseError) as exc:
        raise UserFileError(f"{path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise UserFileError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
    except RecursionError as exc:
        raise UserFileError(f"{path}: nested deeper than {max_depth} levels") from exc
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UserFileError(f"{path}: {shorten(str(exc))}") from exc
    if depth(data, max_depth) > max_depth:
        raise UserFileError(f"{path}: nested deeper than {max_depth} levels")
    return data


def finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserFileError(f"{what}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise UserFileError(f"{what}: expected a finite number >= 0, got {value!r}")
    return float(value)


_VERSION_RE = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})([.+-][0-9A-Za-z.+-]{0,64})?",
                         re.ASCII)


def _version(text: str) -> tuple[int, int, int] | None:
    m = _VERSION_RE.fullmatch(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def check_version(written_by: str, what: str) -> None:
    """A document written by a newer tailgate (or by nothing that names a version this one
    can read) may shape its facts otherwise: refused, never read as "no such fact"."""
    from . import __version__

    if written_by == "":
        return  # written before snapshots named their version: every fact is still checked
    theirs, ours = _version(written_by), _version(__version__)
    if theirs is None:
        raise UserFileError(f"{what}: written by tailgate {shorten(repr(written_by), 40)}, "
                            "not a version this tailgate knows: refused")
    if ours is not None and theirs > ours:
        raise UserFileError(f"{what}: written by tailgate {written_by}, newer than this one "
                            f"({__version__}): its facts may be shaped otherwise: refused "
                            "(judge it with that release or newer)")


def validated(snap, path: str):
    """``snap`` with every fact that does not match its schema (tailgate.schema) replaced by
    a missing fact naming the file and why: the checks that read it say ``unknown``."""
    from .model import Fact
    from .schema import index_refusals, refusal

    for part in ("facts", "before", "earlier"):
        table = getattr(snap, part)
        where = "" if part == "facts" else f" ({part})"
        for name, fact in list(table.items()):
            if not fact.ok:
                continue
            why = refusal(name, fact.value)
            if why is not None:
                table[name] = Fact(missing=f"{path}{where}: {shorten(why, 300)}: refused")
        # an interface list naming another interface than its facts: the checks iterating
        # it would judge a name no collector read and drop the one it did
        lists = {n: f.value for n, f in table.items() if f.ok}
        for name, why in index_refusals(list(table), lists).items():
            table[name] = Fact(missing=f"{path}{where}: {shorten(why, 300)}: refused")
    return snap


def load_snapshot(path: str):
    """A saved snapshot (``--save``), checked for shape before anything judges it: the
    document as a whole (exit 2), then each fact against its schema (refused facts are
    missing, their findings ``unknown``)."""
    from .model import Snapshot

    data = load_json(path)
    if isinstance(data, dict) and "findings" in data and "verdict" in data:
        raise UserFileError(f"{path}: an inspect report (the verdict), not a snapshot (the "
                            "facts): --from needs a file written by `tailgate inspect --save "
                            "FILE`; to show this report again: `tailgate report FILE`")
    try:
        snap = Snapshot.from_json(data)
    except UserFileError as exc:
        raise UserFileError(f"{path}: {exc}") from exc
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise UserFileError(f"{path}: {shorten(str(exc), 200)}") from exc
    check_version(snap.version, path)
    return validated(snap, path)
