"""The JSON report: the stable, machine-readable form of a Report."""

from __future__ import annotations

import json

from ..model import Report


def render_json(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, default=str) + "\n"
