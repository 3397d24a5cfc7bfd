"""The layering (issue 44): import-linter's contracts in pyproject.toml ([tool.importlinter])
hold over grimp's graph of every import in the package, function-local ones included: the
commands are on top, no package's modules import each other in a cycle, llm/ is below bench/,
and no import is let through by an ignore_imports list."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail(f"{lint} is missing: import-linter is in the test extra (pip install -e .[test])")
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                         check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in out.stdout, out.stdout[-2000:]


def test_no_import_is_ignored():
    """The arrows that ran back up (bench/engine.py's types, llm/ -> bench/) are gone: no
    contract lists an import it lets through, so a new one cannot hide in such a list."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert [c["name"] for c in config["contracts"] if c.get("ignore_imports")] == []
