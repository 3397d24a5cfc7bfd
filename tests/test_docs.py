"""The reference manual builds with MkDocs in strict mode, offline: a broken link or anchor
in docs/ fails the build, and so does a warning of any kind. The README stays a front door."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_is_strict_and_clean(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING" not in out.stderr, out.stderr
    # every page of docs/ became a page of the site (nav or not)
    for page in (ROOT / "docs").glob("*.md"):
        assert (tmp_path / "site" / page.with_suffix(".html").name).is_file(), page.name


def test_a_broken_link_fails_the_build(tmp_path):
    """The check above can fail: the same configuration over a page with a dead link does."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](missing.md) and [no anchor](index.md#nowhere)\n")
    config = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[0]
    (tmp_path / "mkdocs.yml").write_text(config + "\n")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "missing.md" in out.stderr and "#nowhere" in out.stderr, out.stderr


def test_a_page_outside_the_nav_is_only_noted(tmp_path):
    """Pages other branches add to docs/ do not break the strict build before they join the nav."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n")
    (docs / "extra.md").write_text("# extra\n\n[home](index.md)\n")
    config = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[0]
    (tmp_path / "mkdocs.yml").write_text(config + "\nnav:\n  - Home: index.md\n")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "extra.md" in out.stderr and "not included in the \"nav\"" in out.stderr, out.stderr


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 400, f"README.md has {len(lines)} lines: the reference belongs in docs/"
