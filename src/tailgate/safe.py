"""Host text made safe to show: every renderer passes host-derived strings through here.

A sysctl value or an interface name may legally hold control characters; raw,
they clear a terminal or set its title (ESC sequences), hide text (bidi
overrides) and make an XML file invalid (XML 1.0 allows no C0 control but tab
and newline, no lone surrogate, no U+FFFE/U+FFFF). They are shown escaped,
``\\x1b``, the way Python's ``repr`` would, so nothing is lost and nothing acts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields, replace
from typing import Any

from .model import Report

# C0 (but tab and newline, handled below), DEL, C1, bidi embeddings/overrides/isolates,
# lone surrogates, and the two XML non-characters.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff\ufffe\uffff]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
                          "\ud800-\udfff\ufffe\uffff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(text: str, keep_newlines: bool = True) -> str:
    """``text`` with every control character escaped (tab and newline kept if asked)."""
    return (_UNSAFE if keep_newlines else _UNSAFE_LINE).sub(_escape, text)


def clean_tree(value: Any, keep_newlines: bool = True) -> Any:
    """Every string (keys too) of a JSON-like value cleaned; non-finite floats as strings
    (``"inf"``, ``"-inf"``, ``"nan"``), so strict JSON can hold them."""
    if isinstance(value, str):
        return clean(value, keep_newlines)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {clean(str(k), keep_newlines): clean_tree(v, keep_newlines) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_tree(v, keep_newlines) for v in value]
    if value is None or isinstance(value, (bool, int)):
        return value
    return clean(str(value), keep_newlines)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """JSON that every strict parser reads: no NaN/Infinity literals (a non-finite float
    is written as the string ``"inf"``/``"-inf"``/``"nan"``), non-ASCII escaped."""
    return json.dumps(_finite(value), allow_nan=False, default=str, **kwargs)


_FINDING_TEXT = ("id", "title", "subject", "observed", "limit", "unit", "reason", "evidence",
                 "remedy")


def clean_report(report: Report, keep_newlines: bool = True) -> Report:
    """The report with every host-derived string cleaned, for a renderer to print."""
    findings = tuple(replace(f, **{k: clean_tree(getattr(f, k), keep_newlines)
                                   for k in _FINDING_TEXT}) for f in report.findings)
    v = report.verdict
    # The verdict repeats findings' subjects and reasons (what stayed unmeasured, and why).
    verdict = replace(v, **{f.name: tuple(clean_tree(list(getattr(v, f.name)), keep_newlines))
                            for f in fields(v) if isinstance(getattr(v, f.name), tuple)})
    return replace(report, version=clean(str(report.version), keep_newlines),
                   host=clean_tree(report.host, keep_newlines),
                   target=clean_tree(report.target, keep_newlines), findings=findings,
                   verdict=verdict, platform=clean_tree(report.platform, keep_newlines))


def one_line(text: str, limit: int = 400) -> str:
    """A message as one printable line: control characters (newlines included) escaped,
    long values cut, whatever a user's file or argument held."""
    text = clean(text, keep_newlines=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."
