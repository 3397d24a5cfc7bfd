"""The layering (issue 44): import-linter's contracts in pyproject.toml ([tool.importlinter])
hold over grimp's graph of every import in the package, function-local ones included: the
commands are on top; neither tailgate's packages nor any package's modules import each other
in a cycle; llm/ is below bench/; sources/ is above probes/ and llm/; only the commands and
the exporter import report/, which is above campaign/, diagnose/ and plan/, above compare,
above bench/, above fleet/; and no import is let through by an ignore_imports list. The
cycles between top-level packages are also listed by a measurement of their own."""

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
    assert "Contracts: 6 kept, 0 broken." in out.stdout, out.stdout[-2000:]


def test_no_import_is_ignored():
    """The arrows that ran back up (bench/engine.py's types, llm/ -> bench/) are gone: no
    contract lists an import it lets through, so a new one cannot hide in such a list."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert [c["name"] for c in config["contracts"] if c.get("ignore_imports")] == []


def top_level_cycles() -> tuple[list[tuple[str, ...]], dict[tuple[str, str], list[str]]]:
    """The import cycles between tailgate's top-level packages and modules (``tailgate.bench``,
    ``tailgate.llm``, ``tailgate.verdict``, ...), each as its sorted members: the strongly
    connected components of grimp's graph folded onto the first level, function-local imports
    included: what the acyclic_siblings contract on ``tailgate`` forbids, listed so that a
    run shows the cycles (``pytest -s``). Also returns, per arrow between two members of a
    cycle, the module imports that draw it."""
    import grimp

    graph = grimp.build_graph("tailgate", cache_dir=None)

    def top(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else None

    arrows: dict[str, set[str]] = {}
    drawn_by: dict[tuple[str, str], list[str]] = {}
    for module in graph.modules:
        a = top(module)
        if a is None:
            continue
        arrows.setdefault(a, set())
        for imported in graph.find_modules_directly_imported_by(module):
            b = top(imported)
            if b is not None and b != a:
                arrows[a].add(b)
                drawn_by.setdefault((a, b), []).append(f"{module} -> {imported}")

    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for b in arrows.get(todo.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    reached = {a: reach(a) for a in arrows}
    cycles, placed = [], set()
    for a in sorted(arrows):
        if a not in placed:
            members = {b for b in reached[a] if a in reached[b]}
            placed |= members
            if len(members) > 1:
                cycles.append(tuple(sorted(members)))
    within = {(a, b): sorted(by) for (a, b), by in drawn_by.items()
              if any(a in c and b in c for c in cycles)}
    return cycles, within


def test_no_cycle_between_top_level_packages():
    cycles, within = top_level_cycles()
    shown = [" <-> ".join(c) for c in cycles] or ["no cycle"]
    shown += [f"  {line}" for arrow in sorted(within) for line in within[arrow]]
    print("\n".join(shown))
    assert cycles == [], "\n".join(shown)


def module_cycles() -> list[list[str]]:
    """Every import cycle between single modules (grimp's graph, function-local imports
    included), found by a depth-first search: each as the loop it closes."""
    import grimp

    graph = grimp.build_graph("tailgate", cache_dir=None)
    arrows = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []
    for root in sorted(arrows):
        if root in state:
            continue
        path, todo = [root], [iter(arrows[root])]
        state[root] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(arrows[nxt]))
    return cycles


def test_no_module_imports_itself_round_a_loop():
    """Not even a package's __init__ and its own modules (which the contracts leave out): so
    no function-local import is there to hide a cycle, and any of them could move to the top
    of its module without one."""
    cycles = module_cycles()
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)
