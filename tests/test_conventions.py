"""Conventions a user expects of a command-line tool and a package (issue 25)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import tailgate

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def test_version_flag_prints_the_package_version():
    r = subprocess.run([sys.executable, "-m", "tailgate", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"tailgate {tailgate.__version__}"
    assert PYPROJECT["project"]["version"] == tailgate.__version__


def test_classifiers_name_the_python_versions_requires_python_allows():
    project = PYPROJECT["project"]
    floor = tuple(int(x) for x in project["requires-python"].removeprefix(">=").split("."))
    versions = [tuple(int(x) for x in c.rsplit(":: ", 1)[1].split("."))
                for c in project["classifiers"]
                if c.startswith("Programming Language :: Python :: 3.")]
    assert versions and min(versions) == floor
    assert (sys.version_info.major, sys.version_info.minor) >= floor
    assert "Operating System :: POSIX :: Linux" in project["classifiers"]
