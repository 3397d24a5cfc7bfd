"""nccl-tests ``*_perf`` output as evidence: parsed into tailgate's collective document (pure).

nccl-tests (github.com/NVIDIA/nccl-tests) prints one table per run: a header
naming the columns, then a row per message size with the out-of-place and the
in-place results. Its columns changed over the years; this parser reads the
header rather than assuming positions, so every variant the print code of
``src/common.cu`` / ``src/util.cu`` has produced is understood:

==========================  ============================================================
nccl-tests (commit, date)   table columns
==========================  ============================================================
initial (b188a15, 2017)     ``bytes N type [op] [root]`` then ``time algbw busbw res``
                            per side; time in **ms**, no units line
NCCL 2.4 (0f8c785, 2019)    ``size count type [redop] [root]``, ``time algbw busbw error``
                            (``error``: max deviation, ``%5.0le``); units line, time in us
NCCL 2.13 (51af557, 2022)   every test prints ``size count type redop root`` (``none``,
                            ``-1`` where unused) and ``#wrong`` (wrong elements, ``%5g``),
                            ``-C 1`` names the time column ``cputime``
copy overlap (7bd5758,      ``time algbw busbw copybw #wrong`` per side when run with side
2024; d39f59d removed it)   work
timestamps (a62c975, 2025)  a trailing ``timestamp`` (``%Y-%m-%d %H:%M:%S``) per row
per-iteration (0fdb00a,     ``-I 1`` adds ``i_min i_max i_p99 i_cv%`` per side
2026)
trace replay                the out-of-place side left blank (in-place only)
==========================  ============================================================

``N/A`` in the error column (``-c 0``: no check) becomes ``null``, never 0.
Anything between the rows (NCCL INFO lines, warnings, a second run) is
skipped; a row that does not fit its header is a :class:`NcclTestsError`
naming its line. Rows from the header's rank list (``#  Rank  0 Group  0 Pid
... on HOST device 0 [...] NAME``) give the number of ranks; without them it
is derived from ``busbw / algbw`` (AllReduce: ``2(n-1)/n``) and said so.
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import InputError
from .spec import BUS_FACTORS

_HEADER_NAMES = {"size", "bytes"}
_RENAME = {"bytes": "size", "n": "count", "op": "redop", "cputime": "time", "res": "error",
           "#wrong": "wrong", "i_cv%": "i_cv"}
_SIDE_FIELDS = {"time", "algbw", "busbw", "wrong", "error", "copybw", "i_min", "i_max",
                "i_p99", "i_cv"}
_PREFIX_FIELDS = {"size", "count", "type", "redop", "root"}
_RANK_LINE = re.compile(r"^#\s+Rank\s+([0-9]+)\b.*?\bon\s+(\S+)\s+device")
_PROGRAM = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_COLLECTIVES = {"all_reduce": "allreduce", "all_gather": "allgather",
                "reduce_scatter": "reducescatter", "alltoall": "alltoall",
                "alltoallv": "alltoallv", "broadcast": "broadcast", "reduce": "reduce",
                "sendrecv": "sendrecv", "gather": "gather", "scatter": "scatter",
                "hypercube": "hypercube"}
_SCALING = ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "gather",
            "scatter")
_PREAMBLE = ("# nThread", "# nccl-tests version", "# Collective test starting")
_INT = re.compile(r"^-?[0-9]+$")
_TIMESTAMP = re.compile(r"^[0-9]{4}-[0-9][0-9]-[0-9][0-9]$")


class NcclTestsError(InputError):
    """The text is not nccl-tests output, or a row does not fit its header (says where)."""


def _num(text: str, line_no: int, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise NcclTestsError(f"line {line_no}: {what} {text!r} is not a number") from None


def _columns(tokens: list[str]) -> tuple[list[str], list[list[str]], bool]:
    """Header tokens -> (prefix columns, one column list per side, has timestamp)."""
    names = [_RENAME.get(t.lower(), t.lower()) for t in tokens]
    timestamp = bool(names) and names[-1] == "timestamp"
    if timestamp:
        names = names[:-1]
    prefix: list[str] = []
    sides: list[list[str]] = []
    for name in names:
        if name == "time":
            sides.append([name])
        elif sides:
            sides[-1].append(name)
        else:
            prefix.append(name)
    if not sides or "size" not in prefix:
        raise NcclTestsError(f"not an nccl-tests table header: {' '.join(tokens)!r}")
    unknown = [n for s in sides for n in s if n not in _SIDE_FIELDS]
    unknown += [n for n in prefix if n not in _PREFIX_FIELDS]
    if unknown:
        raise NcclTestsError(f"unknown nccl-tests column(s) {unknown} in header "
                             f"{' '.join(tokens)!r}")
    return prefix, sides, timestamp


def _side(values: list[str], cols: list[str], line_no: int, time_scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, text in zip(cols, values, strict=True):
        if name in ("wrong", "error") and text.upper() == "N/A":
            out[name] = None
        elif name == "wrong":
            out[name] = int(_num(text, line_no, "#wrong"))
        elif name == "time":
            out["time_us"] = _num(text, line_no, "time") * time_scale
        else:
            out[name] = _num(text, line_no, name)
    return out


def _runs(lines: list[str]) -> list[list[tuple[int, str]]]:
    """Split the text into runs: each begins at a table header (its preamble kept with it)."""
    runs: list[list[tuple[int, str]]] = []
    pre: list[tuple[int, str]] = []
    for no, line in enumerate(lines, 1):
        toks = [t.lower() for t in line.lstrip("#").split()]
        if line.startswith("#") and toks and toks[0] in _HEADER_NAMES and (
                "time" in toks or "cputime" in toks):
            runs.append([*pre, (no, line)])
            pre = []
        elif line.startswith(_PREAMBLE) or _RANK_LINE.match(line) or pre or not runs:
            pre.append((no, line))
        else:
            runs[-1].append((no, line))
    return runs


_TAG = re.compile(r"^\s*(?:\[[0-9]+,[0-9]+\]<std(?:out|err)>:)?\s*")


def parse(text: str, ranks: int | None = None, collective: str | None = None,
          default_collective: str | None = None) -> dict[str, Any]:
    """The first run in an nccl-tests output, as a collective result document.

    ``collective`` overrides what the output says; ``default_collective`` is
    used (with a warning) when it says nothing."""
    # mpirun --tag-output prefixes every line with [job,rank]<stdout>:
    lines = [_TAG.sub("", line, count=1) for line in text.splitlines()]
    runs = _runs(lines)
    if not runs:
        raise NcclTestsError("no nccl-tests table (no '#  size  count  type ... time  algbw  "
                             "busbw' header line)")
    doc = _parse_run(runs[0], lines, ranks, collective, default_collective)
    if len(runs) > 1:
        doc["warnings"].append(f"{len(runs) - 1} more table(s) in this output were not read "
                               "(one run per document)")
    return doc


def _parse_run(run: list[tuple[int, str]], lines: list[str], ranks: int | None,
               collective: str | None, default_collective: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    hosts: dict[int, str] = {}
    header: list[str] | None = None
    time_scale = 1.0
    rows: list[dict[str, Any]] = []
    prefix: list[str] = []
    sides: list[list[str]] = []
    has_ts = False
    first_no = run[0][0]
    for no, line in run:
        if line.startswith("#"):
            body = line[1:].strip()
            m = _RANK_LINE.match(line)
            if m:
                hosts[int(m.group(1))] = m.group(2)
            elif body.startswith("nThread"):
                for key, pat in (("threads", r"nThread ([0-9]+)"), ("gpus_per_thread", r"nGpus ([0-9]+)"),
                                 ("warmup", r"warmup iters: ([0-9]+)"), ("iters", r"\biters: ([0-9]+)"),
                                 ("agg_iters", r"agg iters: ([0-9]+)"),
                                 ("validation", r"validation: ([0-9]+)")):
                    mm = re.search(pat, body.replace("warmup iters", "warmup_iters")
                                   if key == "iters" else body)
                    if mm:
                        meta[key] = int(mm.group(1))
            elif body.startswith("nccl-tests version"):
                meta["version"] = body.split()[2]
            elif body.startswith(("Collective test starting:", "Collective test concluded:")):
                meta["program"] = body.split(":", 1)[1].strip()
            elif body.startswith("Out of bounds values"):
                mm = re.search(r":\s*([0-9]+)", body)
                if mm:
                    meta["out_of_bounds"] = int(mm.group(1))
            elif body.startswith("Avg bus bandwidth"):
                mm = re.search(r":\s*([0-9.eE+-]+)", body)
                if mm:
                    meta["avg_busbw_gbps"] = float(mm.group(1))
            elif header is None and body.split() and body.split()[0].lower() in _HEADER_NAMES:
                header = body.split()
                prefix, sides, has_ts = _columns(header)
                # nccl-tests before 2019 printed ms and no units line; since, a "(us)" line.
                time_scale = 1e3 if header[0].lower() == "bytes" else 1.0
            elif header is not None and "(B)" in body and "(ms)" in body:
                time_scale = 1e3
            continue
        if header is None:
            continue
        toks = line.split()
        if not toks or not _INT.match(toks[0]):
            continue  # NCCL INFO lines, warnings, a launcher's noise
        rows.append(_row(toks, no, prefix, sides, has_ts, time_scale))
    if header is None:
        raise NcclTestsError("no table header")
    if not rows:
        raise NcclTestsError(f"a table header at line {first_no} but no result rows")
    name = collective or _collective(meta.get("program"), lines[: run[0][0]])
    assumed = name is None and default_collective is not None
    if assumed:
        name = default_collective
    n, ranks_from = _ranks(ranks, hosts, meta, name, rows)
    blocks = [b for r in rows for b in _blocks(r, meta)]
    warnings = []
    if assumed:
        warnings.append(f"the output does not name its test (no '# Collective test starting' "
                        f"line or *_perf command): read as {name}")
    if ranks_from == "busbw/algbw":
        warnings.append(f"number of ranks ({n}) derived from busbw/algbw: the output lists no "
                        "devices (give --ranks)")
    if meta.get("out_of_bounds"):
        warnings.append(f"nccl-tests counted {meta['out_of_bounds']} out-of-bounds value(s): "
                        "the results were wrong")
    return {
        "tailgate_collective": 1, "source": "nccl-tests", "collective": name or "unknown",
        "backend": "nccl", "library": ("nccl-tests " + meta["version"]) if "version" in meta
        else "nccl-tests", "ranks": n, "ranks_from": ranks_from,
        "hosts": [hosts[k] for k in sorted(hosts)],
        "config": {"iters": meta.get("iters"), "warmup": meta.get("warmup"),
                   "agg_iters": meta.get("agg_iters"), "validation": meta.get("validation"),
                   "threads": meta.get("threads"), "gpus_per_thread": meta.get("gpus_per_thread"),
                   "dtype": rows[0]["type"], "op": rows[0].get("redop")},
        "nccl_tests": {"columns": header, "time_unit": "ms" if time_scale != 1.0 else "us",
                       "avg_busbw_gbps": meta.get("avg_busbw_gbps"),
                       "out_of_bounds": meta.get("out_of_bounds")},
        "sizes": blocks,
        "warnings": warnings,
    }


def _row(toks: list[str], no: int, prefix: list[str], sides: list[list[str]], has_ts: bool,
         time_scale: float) -> dict[str, Any]:
    ts = None
    if has_ts and len(toks) >= 2 and _TIMESTAMP.match(toks[-2]):
        ts = f"{toks[-2]} {toks[-1]}"
        toks = toks[:-2]
    need = [len(prefix) + sum(len(s) for s in sides)]
    if len(sides) == 2:
        need.append(len(prefix) + len(sides[1]))  # trace replay: out-of-place blank
    if len(toks) not in need:
        raise NcclTestsError(f"line {no}: {len(toks)} fields, the header has "
                             f"{' or '.join(map(str, need))}")
    row: dict[str, Any] = {}
    for name, text in zip(prefix, toks, strict=False):
        if name in ("size", "count"):
            if not _INT.match(text):
                raise NcclTestsError(f"line {no}: {name} {text!r} is not an integer")
            row[name] = int(text)
        elif name == "root":
            row[name] = int(text) if _INT.match(text) else None
        else:
            row[name] = text
    rest = toks[len(prefix):]
    placements = ["out_of_place", "in_place"][: len(sides)]
    if len(toks) != need[0]:  # only the in-place side printed
        row["in_place"] = _side(rest, sides[1], no, time_scale)
    else:
        pos = 0
        for place, cols in zip(placements, sides, strict=True):
            row[place] = _side(rest[pos:pos + len(cols)], cols, no, time_scale)
            pos += len(cols)
    if ts:
        row["timestamp"] = ts
    row["line"] = no
    return row


def _blocks(row: dict[str, Any], meta: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for place in ("out_of_place", "in_place"):
        side = row.get(place)
        if side is None:
            continue
        iters = meta.get("iters")
        lat: dict[str, Any] = {"mean": round(side["time_us"] / 1e3, 9), "count": iters}
        if "i_max" in side:
            lat.update(p99=round(side["i_p99"] / 1e3, 9), max=round(side["i_max"] / 1e3, 9),
                       min=round(side["i_min"] / 1e3, 9))
        block: dict[str, Any] = {
            "bytes": row["size"], "count": row.get("count"), "dtype": row.get("type"),
            "op": row.get("redop"), "root": row.get("root"), "placement": place,
            "iterations": iters, "time_us": side["time_us"],
            "algbw_gbps": side["algbw"], "busbw_gbps": side["busbw"],
            "wrong": side.get("wrong"), "latency_ms": lat, "straggler": None,
            "line": row["line"],
        }
        for extra, key in (("error", "max_error"), ("copybw", "copybw_gbps"),
                           ("i_cv", "cv_pct")):
            if extra in side:
                block[key] = side[extra]
        if "timestamp" in row:
            block["timestamp"] = row["timestamp"]
        out.append(block)
    return out


def _collective(program: str | None, before: list[str]) -> str | None:
    """The collective from ``Collective test starting: all_reduce_perf`` or a command line."""
    for text in ([program] if program else []) + list(reversed(before)):
        m = _PROGRAM.search(text or "")
        if m and m.group(1) in _COLLECTIVES:
            return _COLLECTIVES[m.group(1)]
    return None


def _ranks(given: int | None, hosts: dict[int, str], meta: dict[str, Any],
           collective: str | None, rows: list[dict[str, Any]]) -> tuple[int | None, str | None]:
    if given:
        return given, "--ranks"
    if hosts:
        return max(hosts) + 1, "devices"
    if collective in _SCALING:  # busbw/algbw grows with n for these, so it can name n
        sides = [r.get("out_of_place") or r.get("in_place") for r in rows]
        best = max((sd for sd in sides if sd), key=lambda sd: sd["algbw"], default=None)
        if best and best["algbw"] >= 1.0:
            ratio = best["busbw"] / best["algbw"]
            # both printed with two decimals: the ratio is known to within this
            tol = ratio * (0.005 / best["algbw"] + 0.005 / max(best["busbw"], 0.005))
            fits = [n for n in range(2, 4097)
                    if abs(BUS_FACTORS[collective](n) - ratio) <= tol]
            if len(fits) == 1:
                return fits[0], "busbw/algbw"
    return None, None
