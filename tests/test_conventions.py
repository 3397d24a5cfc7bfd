"""Conventions a user expects of a command-line tool and a package (issue 25)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import tailgate
from support.inspect import gate_code

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


ROOT = Path(__file__).resolve().parents[1]


def _complete(script: Path, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one being completed), with the script loaded
    the way a user's ~/.bashrc would (``source``)."""
    quoted = " ".join(f"'{w}'" for w in words)
    prog = (f"source '{script}' || exit 9\n"
            f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}\n"
            f"COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}\n"
            f"_shtab_tailgate tailgate '{words[-1]}' '{words[-2]}'\n"
            "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", prog], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completion_loads_and_completes_commands_and_options(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tailgate", "completion", "bash"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    script = tmp_path / "tailgate.bash"
    script.write_text(r.stdout)
    assert _complete(script, "tailgate", "ins") == ["inspect"]
    assert _complete(script, "tailgate", "comp") == ["compare", "completion"]
    assert set(_complete(script, "tailgate", "bench", "--ra")) == {"--rate", "--range-ratio",
                                                                   "--ray"}
    assert "--probe-window" in _complete(script, "tailgate", "inspect", "--pro")
    # an argument named FILE completes file names
    (tmp_path / "saved-report.json").write_text("{}")
    here = _complete(script, "tailgate", "report", str(tmp_path / "saved-"))
    assert here == [str(tmp_path / "saved-report.json")], here


def test_zsh_and_tcsh_completion_scripts_name_every_command():
    from tailgate.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for shell, first in (("zsh", "#compdef tailgate"), ("tcsh", "# AUTOMATICALLY GENERATED")):
        r = subprocess.run([sys.executable, "-m", "tailgate", "completion", shell],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.startswith(first), (shell, r.stdout[:80])
        assert all(name in r.stdout for name in sub.choices), shell
    bad = subprocess.run([sys.executable, "-m", "tailgate", "completion", "fish"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'fish'" in bad.stderr


def test_plotly_is_the_html_extra_and_only_html_code_imports_it():
    project = PYPROJECT["project"]
    assert not [d for d in project["dependencies"] if d.startswith("plotly")]
    assert project["optional-dependencies"]["html"] == ["plotly>=5.15"]
    importers = sorted(str(p.relative_to(ROOT / "src")) for p in (ROOT / "src").rglob("*.py")
                       if "import plotly" in p.read_text() or "from plotly" in p.read_text())
    assert importers == ["tailgate/report/bench_html.py",
                         "tailgate/report/diagnose_html.py", "tailgate/report/flame.py",
                         "tailgate/report/html.py", "tailgate/report/plan_plot.py",
                         "tailgate/report/plots.py"]


# A minimal install, as `pip install tailgate` leaves it: plotly cannot be imported.
_NO_PLOTLY = ("import sys; sys.modules['plotly'] = None\n"
              "from tailgate.cli import main\nraise SystemExit(main(sys.argv[1:]))")


def test_without_plotly_the_terminal_works_and_html_is_refused_first(tmp_path):
    ok = subprocess.run([sys.executable, "-c", _NO_PLOTLY, "inspect", "--interval", "0",
                         "--no-history", "--quiet", "--json", str(tmp_path / "r.json")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == gate_code(json.loads((tmp_path / "r.json").read_text())), ok.stderr
    page = tmp_path / "r.html"
    r = subprocess.run([sys.executable, "-c", _NO_PLOTLY, "inspect", "--interval", "0",
                        "--no-history", "--html", str(page)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("tailgate inspect: error: --html needs plotly, which a minimal "
                                "install leaves out: pip install 'tailgate[html]'")
    assert r.stdout == "" and not page.exists()  # refused before inspecting anything
    # the sweep's page too: refused before the first rate is offered (nothing listens on :9)
    r = subprocess.run([sys.executable, "-c", _NO_PLOTLY, "bench", "http://127.0.0.1:9/",
                        "--sweep", "10..20", "--duration", "1s", "--sweep-html",
                        str(tmp_path / "sweep.html")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("tailgate bench: error: --sweep-html needs "
                                                     "plotly"), r.stderr
