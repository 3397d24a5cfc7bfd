"""`--scenario FILE.yaml` on one host, malformed scenarios, and `--ray` usage (issue 13)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.nginx import Nginx
from support.nginx import available as nginx_available
from support.require import require
from tailgate.bench.scenario import ScenarioError, parse_scenario, target_args

TAILGATE = [sys.executable, "-m", "tailgate"]
SRC = str(Path(__file__).resolve().parents[1] / "src")


def tailgate(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*TAILGATE, *argv], capture_output=True, text=True, timeout=timeout,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})


GOOD = """\
defaults:
  duration: 2s
  connections: 2
targets:
  - name: web
    url: http://127.0.0.1:8080/
    rate: 2000
    slo: "p99<5ms"
  - url: tcp://127.0.0.1:6379
    rate: 1k
    payload: "PING\\r\\n"
    delimiter: "\\r\\n"
    duration: 3s
"""


def test_parse_applies_defaults_and_names():
    web, cache = parse_scenario(GOOD, "s.yaml")
    assert (web.name, web.line, cache.name, cache.line) == \
        ("web", 5, "tcp://127.0.0.1:6379", 9)
    assert web.options == {"duration": "2s", "connections": 2, "rate": 2000,
                           "url": "http://127.0.0.1:8080/", "slo": ["p99<5ms"]}
    assert cache.options["duration"] == "3s" and cache.options["payload"] == "PING\r\n"
    import argparse

    ns = target_args(argparse.Namespace(workers=None, rate=None, slo=[], target=None), web)
    assert (ns.target, ns.rate, ns.workers, ns.connections, ns.slo) == \
        ("http://127.0.0.1:8080/", "2000", 1, 2, ["p99<5ms"])


@pytest.mark.parametrize("text, message", [
    ("targets: [\n  {url: x\n", "s.yaml:3: malformed YAML"),
    ("- a\n", "s.yaml:1: expected a mapping with `targets:`"),
    ("target:\n  - url: http://a:1/\n", "s.yaml:1: key target: unknown key"),
    ("defaults: {rate: 1}\n", "s.yaml: no `targets:` list"),
    ("targets: []\n", "s.yaml:1: key targets: expected a non-empty list"),
    ("targets:\n  - rate: 10\n", "s.yaml:2: targets[0]: no `url:` key"),
    ("targets:\n  - url: http://a:1/\n    rat: 10\n", "s.yaml:3: targets[0], key rat: unknown"),
    ("targets:\n  - url: http://a:1/\n    connections: many\n",
     "s.yaml:3: targets[0], key connections: expected int, got str 'many'"),
    ("targets:\n  - url: http://a:1/\n    slo: [1, 2]\n",
     "s.yaml:3: targets[0], key slo: expected a list of strings"),
    ("targets:\n  - url: http://a:1/\n    retry_stale: yes please\n",
     "s.yaml:3: targets[0], key retry_stale: expected bool"),
    ("defaults:\n  url: http://a:1/\ntargets:\n  - url: http://b:1/\n",
     "s.yaml:2: defaults, key url: belongs to one target"),
    ("targets:\n  - {url: http://a:1/, name: a}\n  - {url: http://b:1/, name: a}\n",
     "s.yaml:3: targets[1], key name: 'a' is used twice"),
    ("targets:\n  - url: http://a:1/\n    rate: 1\n    rate: 2\n",
     "s.yaml:4: targets[0], key rate: given twice"),
])
def test_malformed_scenarios_name_file_line_and_key(text, message):
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, "s.yaml")
    assert str(exc.value).startswith(message), str(exc.value)


def test_bad_values_name_the_key_line_on_the_command_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("defaults:\n  duration: 1s\ntargets:\n  - name: web\n"
                 "    url: http://127.0.0.1:9/\n    rate: 10\n    slo: ['p99 < fast']\n")
    r = tailgate("bench", "--scenario", str(f))
    assert r.returncode == 2
    assert f"{f}:7: target 'web', key slo:" in r.stderr, r.stderr
    f.write_text("targets:\n  - name: web\n    url: http://127.0.0.1:9/\n    rate: 10\n"
                 "    duration: 1s\n    coalesce: soon\n")
    r = tailgate("bench", "--scenario", str(f))
    assert r.returncode == 2
    assert f"{f}:6: target 'web', key coalesce: not a duration" in r.stderr, r.stderr
    f.write_text("targets:\n  - url: http://127.0.0.1:9/\n    rate: 10\n")
    r = tailgate("bench", "--scenario", str(f))
    assert r.returncode == 2 and f"{f}:2: target 'http://127.0.0.1:9/':" in r.stderr
    assert "--duration" in r.stderr, r.stderr
    r = tailgate("bench", "http://127.0.0.1:9/", "--scenario", str(f))
    assert r.returncode == 2 and "not both" in r.stderr


def test_scenario_on_one_host_runs_every_target_at_once(tmp_path):
    require(nginx_available())
    with Nginx() as ng:
        f = tmp_path / "peak.yaml"
        f.write_text(f"""\
defaults: {{duration: 2s, connections: 2}}
targets:
  - name: web
    url: {ng.url("/")}
    rate: 300
    slo: ["error_rate<1%", "rate>=290"]
  - name: errors
    url: {ng.url("/500")}
    rate: 50
    slo: ["error_rate<1%"]
  - name: sessions
    url: tcp://127.0.0.1:{ng.port}
    rate: 100
    payload: "GET /tcp HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"
    delimiter: "pong\\n"
""")
        out = tmp_path / "s.json"
        r = tailgate("bench", "--scenario", str(f), "--json", str(out))
    d = json.loads(out.read_text())
    assert r.returncode == 1, r.stderr
    names = [t["name"] for t in d["targets"]]
    assert names == ["web", "errors", "sessions"]
    web, errors, sessions = d["targets"]
    assert web["requests"]["ok"] == 600 and web["generator"]["workers"] == 1
    assert errors["requests"]["errors"]["status_5xx"] == 100
    assert sessions["requests"]["ok"] == 200 and sessions["protocol"] == "tcp"
    # every target ran at the same time: their windows overlap (one start for all workers)
    assert all(t["accounting"]["consistent"] for t in d["targets"])
    assert d["status"] == "fail" and d["failed"] == [{"target": "errors",
                                                       "expr": "error_rate<1%"}]
    assert "mixed peak (3 targets): FAIL (errors: error_rate<1%)" in r.stdout
    assert r.stdout.count("== target ") == 3


def test_ray_options_without_ray_installed_say_how_to_install():
    code = ("import sys; sys.modules['ray'] = None; from tailgate.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    for argv in (["bench", "http://127.0.0.1:9/", "--rate", "1", "--duration", "1s",
                  "--ray", "127.0.0.1:6379"],
                 ["inspect", "--ray", "127.0.0.1:6379", "--interval", "0"]):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                           text=True, timeout=60, env={"PYTHONPATH": SRC})
        assert r.returncode == 2, r.stderr
        assert "pip install 'tailgate[ray]'" in r.stderr, r.stderr


def test_fleet_usage_errors():
    r = tailgate("bench", "http://127.0.0.1:9/", "--rate", "1", "--duration", "1s",
                 "--nodes", "2")
    assert r.returncode == 2 and "--nodes and --per-node need --ray" in r.stderr
    r = tailgate("inspect", "--ray", "127.0.0.1:1", "--pid", "1")
    assert r.returncode == 2 and "--pid names one host's things: not with --ray" in r.stderr


def test_an_unreachable_head_fails_fast_with_the_reason():
    require(None if importlib.util.find_spec("ray") else "Ray is not installed")
    for argv in (["inspect", "--ray", "127.0.0.1:1", "--interval", "0"],
                 ["bench", "http://127.0.0.1:9/", "--rate", "1", "--duration", "1s",
                  "--ray", "127.0.0.1:1"],
                 ["inspect", "--ray", "nohost", "--interval", "0"]):
        r = tailgate(*argv, timeout=30)
        assert r.returncode == 2, r.stderr
        assert "cannot reach the Ray head: Connection refused" in r.stderr or \
            "expected HOST:PORT" in r.stderr, r.stderr


def test_scenario_mixes_http_and_llm_streams(tmp_path):
    """The mixed peak: HTTP requests and OpenAI streams at once (openai+ targets run on the
    bench's one engine, issue 12)."""
    from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server

    require(nginx_available())
    f, out = tmp_path / "mixed.yaml", tmp_path / "m.json"

    def write(ng_url: str, llm_url: str) -> None:
        f.write_text(f"""\
defaults: {{duration: 3s}}
targets:
  - {{name: web, url: "{ng_url}", rate: 100, slo: ["error_rate<1%"]}}
  - name: chat
    url: {llm_url.replace("http://", "openai+http://")}
    rate: 2
    model: {MODEL_NAME}
    input_len: 16
    output_len: 8
    slo: ["ttft_p99<10s"]
""")

    require(llama_cpp_available())
    with Nginx() as ng, llama_server(tmp_path) as llm_url:
        write(ng.url("/"), llm_url)
        r = tailgate("bench", "--scenario", str(f), "--json", str(out), timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    d = json.loads(out.read_text())
    web, chat = d["targets"]
    assert (web["requests"]["ok"], chat["requests"]["ok"]) == (300, 6)
    assert chat["protocol"].startswith("openai") and d["status"] == "pass"
    assert "mixed peak (2 targets): PASS" in r.stdout
