"""Parsing of the small values users type: durations, rates, escaped bytes (pure)."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s|m|h)?\s*$")
_SCALE = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmM]?)\s*(?:/s)?\s*$")


def parse_duration(text: str, default_unit: str = "s") -> float:
    """``"10s"``, ``"500ms"``, ``"2m"``, ``"1.5"`` (in ``default_unit``) -> seconds.

    Raises ValueError with the offending text."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (examples: 10s, 500ms, 2m)")
    return float(m.group(1)) * _SCALE[m.group(2) or default_unit]


def parse_rate(text: str) -> float:
    """``"20000"``, ``"20k"``, ``"1.5M"``, ``"500/s"`` -> requests per second (> 0)."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"not a rate: {text!r} (examples: 1000, 20k, 1.5M)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6}[m.group(2)]
    if value <= 0:
        raise ValueError(f"rate must be positive: {text!r}")
    return value


def unescape(text: str) -> bytes:
    r"""A payload typed on the command line: ``\r``, ``\n``, ``\t``, ``\\``, ``\xNN`` -> bytes."""
    try:
        return text.encode("latin-1").decode("unicode_escape").encode("latin-1")
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        raise ValueError(f"bad escape in {text!r}: {exc}") from None


def percentile_name(p: float) -> str:
    """The JSON key of percentile ``p``: 50 -> p50, 99.9 -> p999, 99.5 -> p995, 5 -> p05
    (the digits with the point dropped, as bench's own p999 and p9999)."""
    text = f"{p:.10g}"
    return "p" + ("0" if p < 10 else "") + text.replace(".", "")


def parse_percentiles(text: str) -> list[tuple[str, float]]:
    """``50,90,95,99,99.9`` -> ``[("p50", 50.0), ...]``, in the order given, once each."""
    import argparse
    import math

    out: dict[str, float] = {}
    for part in text.split(","):
        try:
            p = float(part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a number "
                                             "(e.g. 50,90,95,99,99.9)") from None
        if not math.isfinite(p) or not 1 <= p < 100 or len(f"{p:.10g}".replace(".", "")) > 6:
            raise argparse.ArgumentTypeError(f"{part.strip()}: a percentile is 1 to 99.9999")
        out.setdefault(percentile_name(p), p)
    return list(out.items())
