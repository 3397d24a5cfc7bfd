"""A bench result's files: its JSON document, its HTML page and its HdrHistogram log, each
written where the user asked (``-``: standard output). The runner returns the result and
prints nothing; the ``bench`` command calls :func:`save` with its ``--json``, ``--html`` and
``--hdr`` paths."""

from __future__ import annotations

import json

from ..bench.result import BenchResult, write_hdr
from ..errors import UsageError
from ..outputs import write_output as write
from .bench_html import bench_page


def save(result: BenchResult, json_path: str | None = None, html_path: str | None = None,
         hdr_path: str | None = None) -> None:
    """Write the result's JSON, HTML page and HdrHistogram log where asked (``-``: stdout)."""
    if json_path:
        write(json_path, json.dumps(result.json, indent=2) + "\n")
    if html_path:
        write(html_path, bench_page(result.json))
    if hdr_path:
        try:
            with open(hdr_path, "w", encoding="ascii") as f:
                write_hdr(f, result, result.start_epoch_s)
        except OSError as exc:
            raise UsageError(f"cannot write {hdr_path}: {exc.strerror or exc}") from exc
