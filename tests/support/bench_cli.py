"""Run `tailgate bench` as a user does (its own process) and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    json: dict[str, Any]
    log: dict[str, np.ndarray]  # columns of the per-request log (tailgate.bench.result.read_log)
    hdr: str = ""


def bench(target: str, *args: str, timeout: float = 240, hdr: bool = False) -> Run:
    """``tailgate bench TARGET ARGS --json F --log F [--hdr F]``; the run's files parsed."""
    from tailgate.bench.result import read_log

    with tempfile.TemporaryDirectory(prefix="tailgate-test-") as tmp:
        out, log, h = Path(tmp, "r.json"), Path(tmp, "log.csv"), Path(tmp, "r.hdr")
        extra = ["--hdr", str(h)] if hdr else []
        p = subprocess.run([sys.executable, "-m", "tailgate", "bench", target, *args,
                            "--json", str(out), "--log", str(log), *extra], check=False,
                           capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
        doc = json.loads(out.read_text()) if out.exists() else {}
        cols = read_log(log.read_text()) if log.exists() else {}
        return Run(p.returncode, p.stdout, p.stderr, doc, cols,
                   h.read_text() if hdr and h.exists() else "")


def errors(doc: dict[str, Any]) -> dict[str, int]:
    """The error kinds that occurred (the JSON lists every kind of the protocol)."""
    return {k: v for k, v in doc["requests"]["errors"].items() if v}
