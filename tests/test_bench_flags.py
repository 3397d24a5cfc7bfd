"""Every `tailgate bench` option against every protocol: it applies, or it is refused with a
usage error naming the option and the protocol (issue 12: nothing silently ignored). Then
the options an LLM run gained (--workers, --connections, -H, --hdr, --log, live progress)
end to end against the scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader

from support.bench_cli import bench
from support.llm_server import ScriptedServer
from tailgate.cli import build_parser
from tailgate.commands import bench as bench_cmd
from tailgate.errors import UsageError
from tailgate.hist import DEFAULT_SPEC, merged, parse_log

FIX = Path(__file__).parent / "fixtures" / "llm"
TRACE = str(FIX / "mooncake_conversation_head.jsonl")
BASE = {
    "http": ["http://127.0.0.1:9/", "--rate", "10", "--duration", "1s"],
    "tcp": ["tcp://127.0.0.1:9", "--rate", "10", "--duration", "1s", "--payload", "x",
            "--delimiter", r"\n"],
    "openai": ["openai+http://127.0.0.1:9/v1", "--rate", "10", "--duration", "1s",
               "--model", "m"],
    "udp": ["udp://127.0.0.1:9", "--rate", "10", "--duration", "1s"],
}
SCHEME = {"http": "http://", "tcp": "tcp://", "openai": "openai+http://", "udp": "udp://"}
ALL = ("http", "tcp", "openai", "udp")
STREAMS = ("http", "tcp", "openai")  # connections, requests: not udp://'s one socket
# option -> (the argv that gives it, the protocols it applies to). Every option of the
# bench parser is here (checked below), so a new one must say where it applies.
TABLE: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "--rate": (["--rate", "20"], ALL),
    "--duration": (["--duration", "2s"], ALL),
    "--arrival": (["--arrival", "poisson"], STREAMS),
    "--burstiness": (["--arrival", "gamma", "--burstiness", "0.5"], STREAMS),
    "--warmup": (["--warmup", "0.5s"], ALL),
    "--coalesce": (["--coalesce", "50us"], STREAMS),
    "--connections": (["--connections", "3"], STREAMS),
    "--max-connections": (["--max-connections", "7"], STREAMS),
    "--workers": (["--workers", "2"], STREAMS),
    "--timeout": (["--timeout", "3s"], ALL),
    "--requests": (["--requests", "4"], ALL),
    "--seed": (["--seed", "5"], STREAMS),
    "--slo": (["--slo", "p99<1s"], ALL),
    "--confidence": (["--confidence", "p99=10%@95%"], STREAMS),
    "--engine": (["--engine", "fast"], ALL),  # openai+http:// and udp://: yes
    # many generators (tests/test_scenario.py, test_fleet_ray.py): run() hands these to
    # commands/bench_fleet.py before _parse, for every protocol
    "--ray": (["--ray", "127.0.0.1:6379"], ALL),
    "--nodes": (["--ray", "127.0.0.1:6379", "--nodes", "2"], ALL),
    "--per-node": (["--ray", "127.0.0.1:6379", "--per-node", "2"], ALL),
    "--scenario": (["--scenario", "/dev/null"], ALL),
    "--json": (["--json", "-"], ALL),
    "--html": (["--html", "/dev/null"], ALL),
    "--hdr": (["--hdr", "/dev/null"], ALL),
    "--hdr-interval": (["--hdr", "/dev/null", "--hdr-interval", "2s"], ALL),
    "--log": (["--log", "/dev/null"], STREAMS),
    "--spectrum": (["--spectrum"], ALL),
    "--percentiles": (["--percentiles", "50,95,99.9"], ALL),
    "--min-tail-samples": (["--min-tail-samples", "3"], ALL),
    "--quiet": (["--quiet"], ALL),
    "--max-header-bytes": (["--max-header-bytes", "64KiB"], STREAMS),
    "--max-body-bytes": (["--max-body-bytes", "1MiB"], STREAMS),
    "--retry-stale": (["--retry-stale"], STREAMS),
    "--sweep": (["--sweep", "1..2"], ALL),
    "--sweep-steps": (["--sweep", "1..2", "--sweep-steps", "3"], ALL),
    "--sweep-bisect": (["--sweep", "1..2", "--sweep-bisect", "1"], ALL),
    "--sweep-html": (["--sweep", "1..2", "--sweep-html", "/dev/null"], ALL),
    "--method": (["-X", "POST"], ("http",)),
    "--body": (["--body", "b"], ("http",)),
    "--body-file": (["--body-file", TRACE], ("http",)),
    "--header": (["-H", "X-Test: 1"], ("http", "openai")),
    "--payload": (["--payload", "y"], ("tcp",)),
    "--delimiter": (["--delimiter", r"\r\n"], ("tcp",)),
    "--response-length": (["--response-length", "4"], ("tcp",)),
    "--max-event-bytes": (["--max-event-bytes", "1MiB"], ("openai",)),
    "--max-tokens-per-stream": (["--max-tokens-per-stream", "5000"], ("openai",)),
    "--model": (["--model", "other"], ("openai",)),
    "--api": (["--api", "chat"], ("openai",)),
    "--workload": (["--workload", "random"], ("openai",)),
    "--input-len": (["--input-len", "5"], ("openai",)),
    "--output-len": (["--output-len", "5"], ("openai",)),
    "--range-ratio": (["--workload", "random", "--range-ratio", "0.2"], ("openai",)),
    "--conversations": (["--workload", "multiturn", "--conversations", "3"], ("openai",)),
    "--turns": (["--workload", "multiturn", "--turns", "2"], ("openai",)),
    "--system-len": (["--workload", "multiturn", "--system-len", "9"], ("openai",)),
    "--trace": (["--workload", "trace", "--trace", TRACE], ("openai",)),
    "--trace-token-scale": (["--workload", "trace", "--trace", TRACE,
                             "--trace-token-scale", "0.5"], ("openai",)),
    "--trace-time-scale": (["--workload", "trace", "--trace", TRACE,
                            "--trace-time-scale", "2"], ("openai",)),
    "--allow-no-done": (["--allow-no-done"], ("openai",)),
    "--no-usage": (["--no-usage"], ("openai",)),
    "--ignore-eos": (["--ignore-eos"], ("openai",)),
    "--continuous-usage": (["--continuous-usage"], ("openai",)),
    "--engine-timings": (["--engine-timings", "per-token"], ("openai",)),
    "--size": (["--size", "128"], ("udp",)),
    "--batch": (["--batch", "1"], ("udp",)),
    "--io": (["--io", "io_uring"], ("udp",)),
    "--concurrency": (["--concurrency", "2"], ()),  # closed loop: refused everywhere
    # TLS: for https://, grpcs:// and openai+https:// (tests/test_bench_tls.py): refused
    # for every plaintext target here
    "--insecure": (["--insecure"], ()),
    "--cacert": (["--cacert", TRACE], ()),
    "--cert": (["--cert", TRACE], ()),
    "--key": (["--key", TRACE], ()),
    "--sni": (["--sni", "example.test"], ()),
}
SWEEP = {"--sweep", "--sweep-steps", "--sweep-bisect", "--sweep-html"}


def bench_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["bench"]


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def argv_for(flag: str, protocol: str) -> list[str]:
    given, protos = TABLE[flag]
    if protocol not in protos:  # the flag alone, without what it needs where it applies
        at = next(i for i, x in enumerate(given) if x in (flag, "-X", "-H"))
        given = given[at:]
    base = list(BASE[protocol])
    if flag == "--response-length" and protocol == "tcp":  # a delimiter or a length
        i = base.index("--delimiter")
        del base[i:i + 2]
    if flag in base:  # replace the base's value
        i = base.index(flag)
        del base[i:i + 2]
    return base + given


def test_the_table_names_every_option_of_the_bench_parser():
    options = {a.option_strings[-1] for a in bench_parser()._actions
               if a.option_strings and not isinstance(a, argparse._HelpAction)}
    assert options == set(TABLE)


@pytest.mark.parametrize("protocol", ALL)
@pytest.mark.parametrize("flag", sorted(TABLE))
def test_every_flag_applies_or_is_refused_naming_flag_and_protocol(flag, protocol):
    args = parse(argv_for(flag, protocol))
    applies = protocol in TABLE[flag][1]
    if flag in SWEEP:
        # The sweep re-runs this same bench per rate: the base must parse as a run.
        assert args.sweep == "1..2"
        args.sweep = None
    if applies:
        spec = bench_cmd.spec_of(args)
        info, target = spec.info, spec.target
        assert target.kind == protocol and info.protocol == protocol
        return
    with pytest.raises(UsageError) as err:
        bench_cmd.spec_of(args)
    msg = str(err.value)
    assert flag in msg and (SCHEME[protocol] in msg or flag == "--concurrency"), msg


def test_applied_flags_reach_the_run():
    """A few of the table's flags, followed into what the engine is given."""
    spec = bench_cmd.spec_of(parse(
        [*BASE["openai"], "-H", "Authorization: Bearer t", "--workers", "2",
         "--connections", "3", "--requests", "4", "--api", "chat", "--max-event-bytes",
         "1MiB", "--no-usage", "--allow-no-done", "--slo", "ttft_p99<1s"]))
    info, target, schedule, extra = spec.info, spec.target, spec.schedule, spec.engine_fields
    assert b"\r\nAuthorization: Bearer t\r\n" in target.request
    assert target.request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert (info.workers, info.connections, info.requests) == (2, 3, 4)
    assert schedule.size == 4 and len(extra["requests"]) == 4
    assert all(b'"messages"' in r and b"stream_options" not in r for r in extra["requests"])
    assert extra["max_event_bytes"] == 1 << 20 and extra["require_done"] is False
    assert [g.metric for g in extra["good_slos"]] == ["ttft"]
    # llama-server's timings in every chunk: asked in every request's body, only when given
    assert all(b'"timings_per_token"' not in r for r in extra["requests"])
    per = bench_cmd.spec_of(parse([*BASE["openai"], "--requests", "3", "--engine-timings",
                                   "per-token"]))
    assert all(json.loads(r.split(b"\r\n\r\n", 1)[1])["timings_per_token"] is True
               for r in per.engine_fields["requests"])
    assert per.info.llm["engine_timings"] == "per-token"


def test_workload_options_for_another_workload_are_refused():
    with pytest.raises(UsageError, match="--turns does not apply to --workload fixed"):
        bench_cmd.spec_of(parse([*BASE["openai"], "--turns", "3"]))
    with pytest.raises(UsageError, match="--input-len does not apply to --workload trace"):
        bench_cmd.spec_of(parse([*BASE["openai"], "--workload", "trace", "--trace", TRACE,
                                "--input-len", "3"]))


def test_an_llm_run_on_two_workers_with_headers_hdr_and_log():
    """--workers 2 splits the schedule (every request once), --connections opens them up
    front, -H reaches the server, --hdr writes one tagged series per metric whose
    intervals add up to the run's histograms, --log one row per request."""
    with ScriptedServer(gap_s=0.001) as srv:
        r = bench("openai+" + srv.base, "--model", "m", "--rate", "40", "--requests", "24",
                  "--workers", "2", "--connections", "4", "-H", "X-Tenant: blue",
                  "--output-len", "4", "--input-len", "6", "--hdr-interval", "0.2s", hdr=True)
        heads = list(srv.heads)
        prompts = sorted(int(b["prompt"].split()[0]) for b in srv.bodies)
    assert r.rc == 0, r.stderr
    assert r.json["generator"]["workers"] == 2 and r.json["requests"]["ok"] == 24
    assert prompts == list(range(24))  # each request of the workload sent exactly once
    assert all(b"\r\nX-Tenant: blue\r\n" in h for h in heads) and len(heads) == 24
    assert r.json["connections"]["opened"] >= 4
    assert sorted(set(r.log["worker"].tolist())) == [0, 1] and r.log["id"].size == 24
    _, ivs = parse_log(r.hdr)
    tags = {iv.tag for iv in ivs}
    assert tags == {"TTFT", "ITL", "E2E"}
    assert [iv.start_s for iv in ivs] == sorted(iv.start_s for iv in ivs)  # in time order
    # The reference reader (the hdrhistogram package) sees the same tagged series.
    with tempfile.NamedTemporaryFile("w", suffix=".hlog") as f:
        f.write(r.hdr)
        f.flush()
        reader = HistogramLogReader(f.name, HdrHistogram(1, DEFAULT_SPEC.highest, 3))
        counts: dict[str, int] = {}
        while (h := reader.get_next_interval_histogram()) is not None:
            counts[h.get_tag()] = counts.get(h.get_tag(), 0) + h.total_count
    assert counts == {"TTFT": r.json["ttft_ms"]["count"], "ITL": r.json["itl_ms"]["count"],
                      "E2E": r.json["e2e_ms"]["count"]}
    from tailgate.hist import decode

    for tag, name in (("TTFT", "ttft"), ("ITL", "itl"), ("E2E", "e2e")):
        mine = [iv for iv in ivs if iv.tag == tag]
        assert len(mine) >= 2  # 0.6 s of requests in 0.2 s intervals
        total = merged(iv.histogram for iv in mine)
        whole = decode(r.json["histograms"][name])
        assert total.total == whole.total == r.json[f"{name}_ms"]["count"]
        assert total.max == whole.max


def test_an_llm_run_shows_live_progress_on_a_terminal():
    """On a terminal (a pseudo-terminal here) the run draws the same live panel as any
    bench; with --quiet it draws none."""
    with ScriptedServer(gap_s=0.001) as srv:
        shown = []
        for quiet in ((), ("--quiet",)):
            master, slave = pty.openpty()
            p = subprocess.Popen(
                [sys.executable, "-m", "tailgate", "bench", "openai+" + srv.base, "--model",
                 "m", "--rate", "10", "--duration", "1.5s", "--output-len", "3", *quiet],
                stdout=subprocess.PIPE, stderr=slave, text=True,
                # a terminal that can draw (TERM=dumb, as a bare root has it, cannot), one
                # line per header
                env={**os.environ, "TERM": "xterm", "COLUMNS": "200"})
            os.close(slave)
            err = b""
            while True:
                ready, _, _ = select.select([master], [], [], 30)
                if not ready:
                    break
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                err += chunk
            p.communicate(timeout=60)
            os.close(master)
            assert p.returncode == 0
            shown.append(err.decode(errors="replace"))
    assert "rate/s" in shown[0] and "p999 ms" in shown[0] and "ttft p99 ms" in shown[0]
    assert "rate/s" not in shown[1]


def test_the_per_request_log_of_an_llm_run_adds_token_columns():
    with ScriptedServer(modes=("ok", "status_500"), gap_s=0.001) as srv:
        r = bench("openai+" + srv.base, "--model", "m", "--rate", "40", "--requests", "6",
                  "--output-len", "3", "--workers", "1")
    log = r.log
    ok = log["outcome"] == "ok"
    assert np.count_nonzero(ok) == 3 and np.all(log["chunks"][ok] == 3)
    assert np.all(np.isnan(log["first_token_s"][~ok])) and np.all(log["chunks"][~ok] == 0)
    assert np.all(log["output_tokens"][ok] == 3)  # usage sent by the scripted server


def test_llm_slos_are_refused_for_other_protocols():
    for protocol in ("http", "tcp"):
        with pytest.raises(UsageError, match="unknown SLO metric 'ttft_p99'"):
            bench_cmd.spec_of(parse([*BASE[protocol], "--slo", "ttft_p99<1s"]))
    spec = bench_cmd.spec_of(parse([*BASE["openai"], "--slo", "ttft_p99<1s",
                                    "--slo", "p99<2s"]))
    slos = spec.slos
    assert [s.metric for s in slos] == ["ttft_p99", "latency.p99"]
