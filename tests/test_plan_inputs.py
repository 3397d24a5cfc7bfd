"""`tailgate plan` on hostile input: every user file goes through the hardened reader and
every bad value is exit 2 with one line naming the file, the line or the option; never a
hang, never a traceback (exit 3). Sizes follow one rule (tailgate.units)."""

from __future__ import annotations

import gzip
import json
import signal
from pathlib import Path

import pytest

from tailgate import cli
from tailgate.units import parse_size

FIX = Path(__file__).parent / "fixtures"
CONFIGS = FIX / "plan" / "configs"
LLAMA = CONFIGS / "llama-3.1-8b.json"
HLOG = FIX / "hdr" / "jHiccup-2.0.7S.logV2.hlog"
MOONCAKE_HEAD = FIX / "llm" / "mooncake_conversation_head.jsonl"
VLLM_SPEC = FIX / "llm" / "vllm_0.32.0_cpu_metrics_real_specdecode_ngram.prom"


@pytest.fixture(autouse=True)
def _keep_signal_handlers():
    # cli.main installs SIGTERM/SIGHUP handlers (tailgate.ending): put pytest's back after.
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def plan(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys, *argv: str, words: str) -> str:
    rc, _, err = plan(capsys, *argv)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert words in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sub", [["kv"], ["prefix-cache"], ["fanout", "--from"],
                                 ["specdec", "--metrics"], ["specdec", "--probs"]])
def test_dev_zero_and_a_fifo_are_refused_not_read_forever(capsys, tmp_path, sub):
    refused(capsys, *sub, "/dev/zero", words="not a regular file")
    fifo = tmp_path / "fifo"
    import os

    os.mkfifo(fifo)
    refused(capsys, *sub, str(fifo), words="not a regular file")


@pytest.mark.parametrize("sub", [["kv"], ["prefix-cache"], ["fanout", "--from"],
                                 ["specdec", "--metrics"], ["specdec", "--probs"]])
def test_files_that_are_not_utf8_are_one_line(capsys, tmp_path, sub):
    bad = tmp_path / "latin1.json"
    bad.write_bytes(LLAMA.read_bytes().replace(b'"llama"', b'"ll\xe4ma"'))
    line = refused(capsys, *sub, str(bad), words="not UTF-8")
    assert str(bad) in line and "0xe4" in line


def test_a_gzip_trace_that_is_not_gzip_or_not_utf8(capsys, tmp_path):
    fake = tmp_path / "t.jsonl.gz"
    fake.write_bytes(b"plain text\n")
    refused(capsys, "prefix-cache", str(fake), words="not gzip data")
    latin = tmp_path / "l.jsonl.gz"
    latin.write_bytes(gzip.compress(b'{"hash_ids": [1], "input_length": 1, "x": "\xe4"}\n'))
    refused(capsys, "prefix-cache", str(latin), words="not UTF-8")


@pytest.mark.parametrize("argv,words", [
    (["kv", str(LLAMA), "--hbm", "1e400"], "implausibly large"),
    (["kv", str(LLAMA), "--budget=-5GB"], "not a size"),
    (["kv", str(LLAMA), "--hbm", "80GiB", "--utilization", "nan"], "--utilization nan"),
    (["kv", str(LLAMA), "--hbm", "80GiB", "--utilization", "1.5"], "(0, 1]"),
    (["kv", str(LLAMA), "--tp", "0"], "--tp 0"),
    (["kv", str(LLAMA), "--block-size", "0", "--budget", "1GB"], "--block-size 0"),
    (["fanout", "--from", str(HLOG), "--monte-carlo", "-5"], "--monte-carlo -5"),
    (["fanout", "--from", str(HLOG), "--monte-carlo", "999999999999"], "at most"),
    (["prefix-cache", str(MOONCAKE_HEAD), "--bytes-per-token", "-1"], "--bytes-per-token -1"),
    (["prefix-cache", str(MOONCAKE_HEAD), "--bytes-per-token", "1000", "--hbm", "1e400"],
     "implausibly large"),
    (["prefix-cache", str(MOONCAKE_HEAD), "--target", "nan"], "--target"),
    (["prefix-cache", str(MOONCAKE_HEAD), "--weights", "1,nan,0"], "--weights nan"),
    (["specdec", "--alpha", "nan"], "--alpha nan"),
    (["specdec", "--alpha", "1.5"], "[0, 1]"),
    (["specdec", "--alpha", "0.8", "--cost", "-1"], "--cost -1"),
    (["specdec", "--alpha", "0.8", "--gamma", "0"], "--gamma 0"),
])
def test_bad_values_exit_2_naming_the_option(capsys, argv, words):
    refused(capsys, *argv, words=words)


def test_scale_block_is_a_count_or_tensor(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own one line, exit 2
        cli.main(["plan", "kv", str(LLAMA), "--dtype", "int8", "--scale-block=-1"])
    assert exc.value.code == 2
    assert "--scale-block: '-1': a number of elements >= 1, or tensor" in capsys.readouterr().err


@pytest.mark.parametrize("table,words", [
    ([1, 2, 3], "latency_ms: expected an object"),
    ("fast", "latency_ms: expected an object"),
    ({"p50": -1.0, "p99": 5.0}, "latency_ms.p50: -1.0 is not a latency"),
])
def test_a_bench_json_of_the_wrong_shape_is_one_line(capsys, tmp_path, table, words):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"latency_ms": table}))
    refused(capsys, "fanout", "--from", str(path), "--fanout", "10", words=words)
    path.write_text('{"latency_ms": {"p50": 1e999}}')  # JSON's overflow to infinity
    refused(capsys, "fanout", "--from", str(path), words="is not a latency")


@pytest.mark.parametrize("ids,words", [
    ([[1, 2], [3]], "hash_ids must hold integers, not list"),
    ([{"a": 1}], "hash_ids must hold integers, not dict"),
    ([1.5], "hash_ids must hold integers, not float"),
])
def test_trace_hash_ids_holding_lists_are_one_line(capsys, tmp_path, ids, words):
    path = tmp_path / "trace.jsonl"
    good = MOONCAKE_HEAD.read_text().splitlines()[0]
    path.write_text(good + "\n" + json.dumps({"timestamp": 1, "input_length": 512 * len(ids),
                                              "output_length": 1, "hash_ids": ids}) + "\n")
    line = refused(capsys, "prefix-cache", str(path), words=words)
    assert "line 2" in line


def test_trace_lines_nested_too_deep_or_with_huge_numbers(capsys, tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(MOONCAKE_HEAD.read_text().splitlines()[0] + "\n" + "[" * 100000 + "\n")
    refused(capsys, "prefix-cache", str(path), "--format", "mooncake", words="line 2")
    path.write_text('{"tokens": [' + "9" * 5000 + "]}\n")
    refused(capsys, "prefix-cache", str(path), words="line 1")


def test_probabilities_that_are_not_probabilities(capsys, tmp_path):
    path = tmp_path / "p.jsonl"
    for line, words in (('{"target_prob": "x", "draft_prob": 0.5}', "line 1: target_prob"),
                        ('{"target": [[1]], "draft": [0.5]}', "line 1: target must be"),
                        ('{"target_prob": 1e999, "draft_prob": 0.5}', "line 1")):
        path.write_text(line + "\n")
        refused(capsys, "specdec", "--probs", str(path), words=words)


def test_a_metrics_file_with_impossible_counters_is_refused(capsys, tmp_path):
    path = tmp_path / "m.prom"
    path.write_text(VLLM_SPEC.read_text().replace("# EOF\n", "") +
                    'vllm:spec_decode_num_accepted_tokens_total{engine="9"} 1e12\n')
    refused(capsys, "specdec", "--metrics", str(path), words="impossible counters")


# -- one size rule -------------------------------------------------------------------------------

def test_one_size_rule_everywhere():
    from tailgate.bench.collective.spec import parse_size as collective
    from tailgate.bench.spec import parse_size as bench
    from tailgate.plan.kv import parse_size as kv

    for text, want in (("64K", 64_000), ("64KB", 64_000), ("64KiB", 65_536), ("64ki", 65_536),
                       ("1.5e9", 1_500_000_000), ("80GiB", 80 * 2**30), ("141GB", 141 * 10**9),
                       ("16MiB", 16 * 2**20), ("1.1KB", 1100), ("4096", 4096)):
        assert parse_size(text) == bench(text) == kv(text) == want, text
        if want <= 16 << 30:
            assert collective(text) == want, text
    for text, words in (("1e400", "implausibly large"), ("0.5", "whole number"),
                        ("-1", "not a size"), ("٣K", "not a size"), ("1 XB", "not a size"),
                        ("nan", "not a size"), ("inf", "not a size")):
        with pytest.raises(ValueError, match=words):
            parse_size(text)


@pytest.mark.timeout(60)
def test_bench_body_file_and_nccl_tests_file_use_the_hardened_reader(capsys):
    rc = cli.main(["bench", "http://127.0.0.1:9/", "--rate", "1", "--duration", "1s",
                   "--body-file", "/dev/zero"])
    err = capsys.readouterr().err
    assert rc == 2 and "--body-file: /dev/zero" in err and "not a regular file" in err, err
    rc = cli.main(["bench", "allreduce", "--nccl-tests", "/dev/zero"])
    err = capsys.readouterr().err
    assert rc == 2 and "not a regular file" in err, err


# -- plan.traces.load, the library entry, reads through the same bounded reader ---------------

@pytest.mark.timeout(60)
def test_traces_load_refuses_what_is_not_a_regular_file(tmp_path):
    import os

    from tailgate.plan import traces
    from tailgate.userfiles import UserFileError

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):  # were read for ever with plain open()
        with pytest.raises(UserFileError, match="not a regular file") as exc:
            traces.load(path)
        assert path in str(exc.value) and len(str(exc.value).splitlines()) == 1


@pytest.mark.parametrize("name,data,words", [
    ("latin1.jsonl", b'{"hash_ids": [1], "input_length": 1, "x": "\xe4"}\n',
     "not UTF-8 text (byte 0xe4 at offset 43)"),
    ("fake.jsonl.gz", b"plain text\n", "not gzip data"),
    ("bomb.jsonl.gz", gzip.compress(b"\n" * 4097), "over 4,096 bytes decompressed: refused"),
    ("big.jsonl", b"\n" * 4097, "4097 bytes, over the"),
])
def test_traces_read_lines_refusals_name_the_file(tmp_path, name, data, words):
    from tailgate.plan import traces
    from tailgate.userfiles import UserFileError

    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(UserFileError) as exc:
        traces.read_lines(str(path), limit=4096)
    line = str(exc.value)
    assert str(path) in line and words in line and len(line.splitlines()) == 1, line


def test_traces_load_reads_a_gzip_trace_within_the_cap(tmp_path):
    from tailgate.plan import traces

    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(MOONCAKE_HEAD.read_bytes()))
    fmt, block, reqs = traces.load(str(path))
    plain = traces.load(str(MOONCAKE_HEAD))
    assert (fmt, block) == ("mooncake", 512) and reqs == plain[2] and len(reqs) > 0
