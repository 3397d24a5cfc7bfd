"""The JSON report: the stable, machine-readable form of a Report.

Strict JSON (``allow_nan=False``): a non-finite number is written as a string, never
as the ``NaN``/``Infinity`` that strict parsers reject; JSON escapes control characters.
"""

from __future__ import annotations

from ..model import Report
from ..safe import strict_json


def render_json(report: Report) -> str:
    return strict_json(report.to_json(), indent=2) + "\n"
