"""The plan page's options reference (docs/plan.md) lists every option of every
`tailgate plan` subcommand."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tailgate.cli import build_parser

PLAN = (Path(__file__).resolve().parents[1] / "docs" / "plan.md").read_text()


def plan_subcommands() -> dict[str, argparse.ArgumentParser]:
    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    plan = top.choices["plan"]
    sub = next(a for a in plan._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def reference(name: str) -> str:
    ref = PLAN.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    part = ref.split("### `tailgate plan SUB`", 1)[1].split("\n### ", 1)[0]
    assert f"`tailgate plan {name}`" in part, f"docs/plan.md: no options table for `tailgate plan {name}`"
    return part.split(f"`tailgate plan {name}`", 1)[1].split("\n`tailgate plan ", 1)[0]


@pytest.mark.parametrize("name", sorted(plan_subcommands()))
def test_every_plan_option_is_documented(name):
    text = reference(name)
    missing = [opt for action in plan_subcommands()[name]._actions
               if not isinstance(action, argparse._HelpAction)
               for opt in action.option_strings
               if not re.search(rf"`{re.escape(opt)}[ `]", text)]
    assert not missing, f"tailgate plan {name}: undocumented in docs/plan.md: {missing}"
