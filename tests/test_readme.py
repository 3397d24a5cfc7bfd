"""The README is self-contained and documents every option of every command (issue 9)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tailgate.cli import build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def reference(name: str) -> str:
    """The README's command-reference subsection that names `tailgate NAME`."""
    ref = README.split("## Command reference", 1)[1].split("\n## ", 1)[0]
    for part in ref.split("\n### ")[1:]:
        if re.search(rf"`tailgate {re.escape(name)}( [A-Z]+)?`", part.splitlines()[0]):
            return part
    raise AssertionError(f"README: no command reference for `tailgate {name}`")


def test_no_link_leaves_the_repository():
    for target in re.findall(r"\]\(([^)]+)\)", README):
        assert not target.startswith(("../", "/")), f"README links outside the repository: {target}"


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_option_is_documented(name):
    text = reference(name)
    parser = commands()[name]
    # "Every option of `tailgate bench`": those are documented in bench's section
    inherits = re.findall(r"Every option of `tailgate (\w+)`", text)
    for other in inherits:
        text += reference(other)
    missing = [opt for action in parser._actions if not isinstance(action, argparse._HelpAction)
               for opt in action.option_strings
               if not re.search(rf"(`|, ){re.escape(opt)}[ `,\\]", text)]
    assert not missing, f"tailgate {name}: undocumented in the README's command reference: {missing}"
