"""The reference under docs/ documents every option of every command, on that command's page
(its "## Options" section), and no link of the README or the docs leaves the repository."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tailgate.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options_sections() -> list[tuple[Path, str]]:
    """Each docs page's "## Options" section, split at its "### `tailgate ...`" headings."""
    parts = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        if "\n## Options\n" not in text:
            continue
        section = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
        parts += [(page, part) for part in section.split("\n### ")[1:]]
    return parts


def reference(name: str) -> str:
    """The options reference of `tailgate NAME`, wherever in docs/ its page is."""
    found = [part for _, part in options_sections()
             if re.search(rf"`tailgate {re.escape(name)}( [A-Z]+)?`", part.splitlines()[0])]
    assert found, f"docs/: no '## Options' subsection for `tailgate {name}`"
    assert len(found) == 1, f"docs/: `tailgate {name}` has {len(found)} options sections"
    return found[0]


def test_no_link_leaves_the_repository():
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
            assert not target.startswith(("../", "/")), f"{page.name} links outside the repository: {target}"


def test_every_readme_link_resolves():
    """The README is read on the forge, outside the MkDocs build: its own links are checked here."""
    for target in re.findall(r"\]\(([^)]+)\)", README):
        path, _, anchor = target.partition("#")
        if target.startswith(("http://", "https://")):
            continue
        file = ROOT / path if path else ROOT / "README.md"
        assert file.is_file(), f"README links to a missing file: {target}"
        if anchor:
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
            assert anchor in slugs, f"README links to a missing anchor: {target}"


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
    assert not missing, f"tailgate {name}: undocumented in docs/: {missing}"
