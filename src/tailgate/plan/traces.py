"""Request traces as block-hash chains for the prefix-cache simulator (pure parsers).

* **Mooncake** (kvcache-ai/Mooncake ``FAST25-release/traces/*.jsonl``): one JSON
  object a line with ``timestamp`` (ms), ``input_length``, ``output_length`` and
  ``hash_ids``, one id per 512-token block of the prompt, equal ids meaning
  equal prefixes (Mooncake's README: "block size 512"). Only full blocks are
  cacheable (as in vLLM and SGLang), so a prompt's chain is its first
  ``input_length // 512`` ids.
* **Token lists** (``{"prompt_token_ids": [...]}`` or ``{"tokens": [...]}``, one
  a line, e.g. a tokenizer run over real prompts): hashed here into a chain the
  way vLLM does, each full block's hash covering its parent's hash and its
  tokens, for any block size (16 and 64 are the engines' defaults).
* **Azure LLM inference traces** (``TIMESTAMP,ContextTokens,GeneratedTokens``):
  lengths and arrival times without content, so no two prompts can be known to
  share a prefix; every block is unique. A replay measures cache pressure and
  gives the no-sharing floor (hit rate 0), nothing more.

A file that is not the format it claims raises :class:`TraceError` with the line.
"""

from __future__ import annotations

import csv
import json
import math
import os
import zlib
from collections.abc import Iterator
from datetime import datetime

from ..errors import InputError
from .prefix_cache import Request

MOONCAKE_BLOCK = 512


class TraceError(InputError):
    """A trace line that does not parse (the message names the line)."""


MAX_TRACE_BYTES = 2**30  # a trace, decompressed: Mooncake's are tens of MB


def read_lines(path: str, limit: int = MAX_TRACE_BYTES) -> list[str]:
    """The lines of the trace file ``path`` (``.gz`` decompressed), through the hardened
    reader: a regular file under ``limit`` bytes (decompressed too), strict UTF-8. Anything
    else (/dev/zero, a FIFO, a gzip bomb, Latin-1) is a one-line
    :class:`~tailgate.userfiles.UserFileError` naming the file, never a hang."""
    from ..host import TooLarge, read_regular
    from ..model import SourceError
    from ..userfiles import UserFileError

    try:
        data = read_regular(os.path.realpath(path), limit, what=path)
    except TooLarge as exc:
        raise UserFileError(str(exc)) from None
    except SourceError as exc:
        raise UserFileError(f"cannot read {exc}") from None
    if path.endswith(".gz"):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = d.decompress(data, limit + 1)
        except zlib.error as exc:
            raise UserFileError(f"{path}: not gzip data ({exc})") from None
        if len(out) > limit or d.unconsumed_tail:
            raise UserFileError(f"{path}: over {limit:,} bytes decompressed: refused")
        data = out
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None
    return text.splitlines(keepends=True)


def sniff(first_line: str) -> str:
    line = first_line.strip()
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise TraceError("line 1: not JSON") from None
        except (RecursionError, ValueError) as exc:
            raise TraceError(f"line 1: not usable JSON ({str(exc)[:80]})") from None
        if not isinstance(obj, dict):
            raise TraceError("line 1: not a JSON object")
        if "hash_ids" in obj:
            return "mooncake"
        if "prompt_token_ids" in obj or "tokens" in obj:
            return "tokens"
        raise TraceError("line 1: JSON without hash_ids or prompt_token_ids/tokens")
    if line.replace(" ", "").upper().startswith("TIMESTAMP,CONTEXTTOKENS"):
        return "azure"
    raise TraceError("unknown trace format (Mooncake JSONL, token JSONL or Azure CSV)")


def _int(obj: dict, key: str, n: int) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TraceError(f"line {n}: {key} must be a non-negative integer, not {v!r}")
    return v


def parse_mooncake(lines: Iterator[str], limit: int | None = None) -> list[Request]:
    out: list[Request] = []
    for n, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"line {n}: not JSON ({exc.msg})") from None
        except (RecursionError, ValueError) as exc:  # nested too deep, a 5000-digit number
            raise TraceError(f"line {n}: not usable JSON ({str(exc)[:80]})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"line {n}: not a JSON object")
        ids = obj.get("hash_ids")
        if not isinstance(ids, list):
            raise TraceError(f"line {n}: hash_ids must be a list")
        bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, int | str)), None)
        if bad is not None:  # a list or an object would be unhashable in the simulator
            raise TraceError(f"line {n}: hash_ids must hold integers, not {type(bad).__name__}")
        length = _int(obj, "input_length", n)
        if len(ids) < length // MOONCAKE_BLOCK:
            raise TraceError(f"line {n}: {len(ids)} hash_ids for {length} tokens "
                             f"(at least {length // MOONCAKE_BLOCK} blocks of {MOONCAKE_BLOCK})")
        ts = obj.get("timestamp", 0)
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise TraceError(f"line {n}: timestamp must be a finite number")
        out.append(Request(ids[:length // MOONCAKE_BLOCK], length, float(ts)))
    return out


def chain_hashes(tokens: list[int], block_size: int) -> list[int]:
    """vLLM-style chained block hashes: block i's hash covers block i-1's and its tokens."""
    out, parent = [], None
    for i in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[i:i + block_size])))
        out.append(parent)
    return out


def parse_tokens(lines: Iterator[str], block_size: int, limit: int | None = None) -> list[Request]:
    if block_size <= 0:
        raise ValueError(f"block size must be > 0, not {block_size}")
    out: list[Request] = []
    for n, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"line {n}: not JSON ({exc.msg})") from None
        except (RecursionError, ValueError) as exc:  # nested too deep, a 5000-digit number
            raise TraceError(f"line {n}: not usable JSON ({str(exc)[:80]})") from None
        toks = obj.get("prompt_token_ids", obj.get("tokens")) if isinstance(obj, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
            raise TraceError(f"line {n}: prompt_token_ids must be a list of integers")
        ts = obj.get("timestamp", 0)
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise TraceError(f"line {n}: timestamp must be a finite number")
        out.append(Request(chain_hashes(toks, block_size), len(toks), float(ts)))
    return out


def parse_azure(lines: Iterator[str], block_size: int, limit: int | None = None) -> list[Request]:
    if block_size <= 0:
        raise ValueError(f"block size must be > 0, not {block_size}")
    reader = csv.reader(lines)
    header = next(reader, None)
    if not header or [h.strip() for h in header[:2]] != ["TIMESTAMP", "ContextTokens"]:
        raise TraceError("line 1: expected TIMESTAMP,ContextTokens,GeneratedTokens")
    out: list[Request] = []
    t0 = None
    next_id = 0
    for n, row in enumerate(reader, 2):
        if limit is not None and len(out) >= limit:
            break
        if not row:
            continue
        try:
            # 7 fractional digits: more than datetime takes, and they are below 1 ms anyway
            stamp = datetime.fromisoformat(row[0].strip()[:26])
            ctx = int(row[1])
        except (ValueError, IndexError):
            raise TraceError(f"line {n}: expected a timestamp and a token count") from None
        if ctx < 0:
            raise TraceError(f"line {n}: negative ContextTokens")
        t0 = stamp if t0 is None else t0
        blocks = ctx // block_size
        out.append(Request(list(range(next_id, next_id + blocks)), ctx,
                           (stamp - t0).total_seconds() * 1000.0))
        next_id += blocks
    return out


def load(path: str, fmt: str | None = None, block_size: int = 16,
         limit: int | None = None) -> tuple[str, int, list[Request]]:
    """(format, block size in tokens, requests) of a trace file (a UserFileError if it
    cannot be read, a TraceError if it does not parse: both ValueErrors)."""
    return load_lines(read_lines(path), fmt, block_size, limit)


def load_lines(lines, fmt: str | None = None, block_size: int = 16,
               limit: int | None = None) -> tuple[str, int, list[Request]]:
    """As :func:`load`, from the trace's lines (read by the caller, e.g. under a size cap)."""
    it = iter(lines)
    first = next(it, "")
    fmt = fmt or sniff(first)
    rest = _chain(first, it)
    if fmt == "mooncake":
        return fmt, MOONCAKE_BLOCK, parse_mooncake(rest, limit)
    if fmt == "tokens":
        return fmt, block_size, parse_tokens(rest, block_size, limit)
    if fmt == "azure":
        return fmt, block_size, parse_azure(rest, block_size, limit)
    raise TraceError(f"unknown trace format {fmt!r} (mooncake, tokens, azure)")


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest
