"""openai+http:// on the compiled loop (issue 27): the C loop frames each response and its
event stream and timestamps each event as its read arrives; bench/fast_sse.py reads the
JSON off the hot path. Here: the feed function (``fastloop.frame``, no socket) against the
Python engine's OpenAIConnection on what the codec table (tests/test_http1_codec.py) cannot
hold: huge lines, never-ending events, where a read's boundary decides; then whole runs
against the misbehaving servers the Python path is tested against, request by request
against the Python engine."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest

from support.threaded_server import ThreadedServer
from tailgate.bench.framing import frame, frame_fast

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
EOF_HEAD = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
DONE = b"data: [DONE]\n\n"


def piece(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def tok(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


def split(msg: bytes, size: int) -> list[bytes]:
    return [msg[i:i + size] for i in range(0, len(msg), size)]


def both(chunks: list[bytes], **opts):
    py = frame("openai", chunks, **opts)
    fast = frame_fast("openai", chunks, **opts)
    assert py == fast
    return py


# -- huge lines and never-ending events: the bound holds at any read boundary ---------------

@pytest.mark.parametrize("size", [1 << 30, 65536, 4093])
def test_a_line_past_one_mib_is_too_large_at_any_read_boundary(size):
    msg = EOF_HEAD + tok(" a") + b"data: " + b"x" * (1 << 20) + b"\n\n" + DONE
    got = both(split(msg, size), eof=True)
    assert got.outcome == "too_large"
    assert got.reason == "an event-stream line exceeds 1048576 bytes"
    # the read that carried the token before the huge line: whole, it is dropped with the
    # failing read (SSEParser.feed raised); in pieces it came first and counted
    assert got.tokens == (0 if size > len(msg) else 1)


@pytest.mark.parametrize(("length", "want"), [(1 << 20, "ok"), ((1 << 20) + 1, "too_large")])
def test_a_line_of_exactly_one_mib_is_the_last_that_passes(length, want):
    line = b'data: {"choices":[{"text":"' + b"y" * (length - 31) + b'"}]}'
    assert len(line) == length
    got = both(split(EOF_HEAD + line + b"\r\n\r\n" + DONE, 65536), eof=True)
    assert got.outcome == want


@pytest.mark.parametrize("size", [1 << 30, 65536])
def test_an_event_that_never_ends_is_cut_at_max_event(size):
    line = b"data: " + b"z" * 65530 + b"\n"  # 65537 bytes: 16 of them pass 1 MiB
    msg = EOF_HEAD + line * 17
    got = both(split(msg, size), max_event=1 << 20)
    assert got.outcome == "too_large"
    assert got.reason == "an event exceeds 1048576 bytes without its closing blank line"


def test_an_endless_token_stream_stops_at_max_tokens():
    msg = HEAD + piece(tok(" t") * 300)
    got = both(split(msg, 997), max_tokens=250)
    assert (got.outcome, got.tokens) == ("too_large", 250)
    assert got.reason == "more than 250 tokens in one stream (--max-tokens-per-stream)"


# -- which failure wins depends on the read, on both engines alike ---------------------------

def test_a_framing_error_in_the_same_read_beats_a_bad_chunk():
    bad = HEAD + piece(b"data: {bad\n\n") + b"zz\r\n"
    whole = both([bad])
    assert (whole.outcome, whole.reason) == ("protocol", "bad chunk-size line b'zz\\r'")
    apart = both([bad[:-4], bad[-4:]])  # the bad chunk's read came first
    assert apart.outcome == "malformed_sse"


def test_a_bad_line_after_done_in_the_same_chunk_still_fails_it():
    # SSEParser.feed reads a whole chunk before its events count: the line after [DONE]
    # fails it; in a chunk of its own it is after the stream's end and ignored.
    same = both([HEAD + piece(tok(" a") + DONE + b"\xff\n") + b"0\r\n\r\n"])
    assert same.outcome == "malformed_sse"
    assert same.reason.startswith("event-stream line is not UTF-8: 'utf-8' codec can't decode")
    apart = both([HEAD + piece(tok(" a") + DONE) + piece(b"\xff\n") + b"0\r\n\r\n"])
    assert (apart.outcome, apart.tokens) == ("ok", 1)


def test_an_error_event_ends_the_stream_where_it_stands():
    msg = HEAD + piece(tok(" a") + b'event: error\ndata: {"error": {"message": "m"}}\n\n'
                       + tok(" b")) + b"0\r\n\r\n"
    got = both([msg])
    assert (got.outcome, got.reason, got.tokens) == ("server_error", "event: error: m", 1)


def test_the_stream_settles_at_done_and_the_framing_still_ends_it():
    chunks = [HEAD + piece(tok(" a") + tok(" b", "stop")), piece(DONE), piece(b"junk\n\n")]
    assert both(chunks).outcome is None  # the response is not over yet
    got = both([*chunks, b"0\r\n\r\n"])
    assert (got.outcome, got.tokens, got.open) == ("ok", 2, True)


# -- whole runs: `tailgate bench` on both engines against real servers ------------------------

def llm_run(engine: str, base: str, *args: str, n: int = 84):
    from support.bench_cli import bench

    return bench("openai+" + base, "--engine", engine, "--model", "m", "--workload", "random",
                 "--input-len", "8", "--output-len", "6", "--range-ratio", "0.5",
                 "--rate", "60", "--requests", str(n), "--seed", "7", "--timeout", "3s",
                 "--workers", "1", *args)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_both_engines_agree_request_by_request_on_a_deterministic_server(tls, tmp_path):
    """Each request's behaviour depends only on its body (support/sse_server.py): the same
    workload through both engines must give every request the same outcome, status, bytes,
    content chunks and token counts; and the compiled run's token times lie inside each
    request. Over TLS too: OpenSSL in the compiled loop, the stdlib's ssl in the other."""
    from support.bench_cli import errors
    from support.sse_server import WANT, SseServer
    from support.tls_certs import Pki

    pki = Pki(tmp_path) if tls else None
    extra = ("--cacert", pki.ca) if pki else ()
    runs, modes = {}, {}
    for engine in ("fast", "python"):
        with SseServer(tls=(pki.server_cert, pki.server_key) if pki else None) as srv:
            runs[engine] = llm_run(engine, srv.base, *extra)
            modes[engine] = dict(srv.modes)
    fast, py = runs["fast"], runs["python"]
    assert fast.json["generator"]["engine"] == "fast", fast.stderr
    assert py.json["generator"]["engine"] == "python", py.stderr
    assert modes["fast"] == modes["python"] and len(modes["fast"]) == len(set(WANT))
    want: dict[str, int] = {}
    for mode, count in modes["fast"].items():
        want[WANT[mode]] = want.get(WANT[mode], 0) + count
    for run in (fast, py):
        req = run.json["requests"]
        assert req["scheduled"] == req["sent"] == 84 and req["abandoned"] == 0, req
        assert run.json["accounting"]["consistent"], run.json["accounting"]
        assert {"ok": req["ok"], **errors(run.json)} == want
    assert fast.json["requests"]["error_examples"] == py.json["requests"]["error_examples"]
    order_f, order_p = np.argsort(fast.log["id"]), np.argsort(py.log["id"])
    for col in ("id", "outcome", "status", "bytes", "chunks", "output_tokens", "input_tokens",
                "warmup"):
        assert fast.log[col][order_f].tolist() == py.log[col][order_p].tolist(), col
    for name in ("ok", "good", "warmup_ok"):
        assert fast.json["requests"][name] == py.json["requests"][name]
    assert fast.json["tokens"] == py.json["tokens"]
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert fast.json[key]["count"] == py.json[key]["count"], key
    log = fast.log
    ok = log["outcome"] == "ok"
    assert np.all(log["send_s"][ok] <= log["first_token_s"][ok])
    assert np.all(log["first_token_s"][ok] <= log["last_token_s"][ok])
    assert np.all(log["last_token_s"][ok] <= log["done_s"][ok])
    assert np.all(log["done_s"][ok] <= log["end_s"][ok])


def test_every_scripted_fault_counts_alike_on_both_engines():
    """tests/test_llm_faults.py's faults (its server: tests/support/llm_server.py), through
    both engines on a kept-alive server: the same counts and the same example reasons."""
    from support.bench_cli import bench
    from support.llm_server import FAULTS, ScriptedServer

    got = {}
    for engine in ("fast", "python"):
        with ScriptedServer(modes=FAULTS, gap_s=0.002, keep_alive=True) as srv:
            got[engine] = bench("openai+" + srv.base, "--engine", engine, "--model", "m",
                                "--rate", "40", "--seed", "1", "--timeout", "3s",
                                "--input-len", "12", "--output-len", "6",
                                "--requests", str(2 * len(FAULTS)), "--workers", "1")
    fast, py = got["fast"].json, got["python"].json
    assert fast["generator"]["engine"] == "fast" and py["generator"]["engine"] == "python"
    assert fast["requests"]["errors"] == py["requests"]["errors"]
    assert fast["requests"]["ok"] == py["requests"]["ok"] == 6  # ok, eof_delimited_done, interim_100
    assert fast["requests"]["error_examples"] == py["requests"]["error_examples"]
    assert fast["tokens"] == py["tokens"]


STRAY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize("late_s, ok", [(None, 2), (0.3, 4)])
def test_a_stray_response_after_streams_relabels_them_on_both_engines(late_s, ok):
    """A server that follows every third stream on a connection with a response nobody
    asked for: the streams completed ok on that connection after its first may have been
    answered out of step, so they become protocol (conn.py), on both engines alike, in the
    counts, the --log rows, the tokens and the goodput.

    In the third stream's own write, the stray is read before those streams are recorded
    and answers the fourth request, whose own response then shows up in surplus: 4 out of
    step. 300 ms later, between requests 500 ms apart, it arrives on an idle connection after
    the second and third were recorded ok: the recorder takes those 2 back."""
    import asyncio
    import threading

    from support.bench_cli import bench

    async def handle(reader, writer):
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(n)
                served += 1
                out = HEAD + piece(tok(" a")) + piece(DONE) + b"0\r\n\r\n"
                writer.write(out + STRAY if served == 3 and late_s is None else out)
                await writer.drain()
                if served == 3 and late_s is not None:
                    await asyncio.sleep(late_s)
                    writer.write(STRAY)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    ready, box = threading.Event(), {}

    def serve():
        async def main():
            srv = await asyncio.start_server(handle, "127.0.0.1", 0)
            box["port"], box["loop"], box["stop"] = (srv.sockets[0].getsockname()[1],
                                                     asyncio.get_running_loop(), asyncio.Event())
            ready.set()
            await box["stop"].wait()
            srv.close()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        runs = {e: bench(f"openai+http://127.0.0.1:{box['port']}/v1", "--engine", e, "--model",
                         "m", "--rate", "20" if late_s is None else "2", "--requests", "6",
                         "--workers", "1",
                         "--connections", "1", "--max-connections", "1", "--input-len", "4",
                         "--output-len", "1", "--timeout", "5s")
                for e in ("fast", "python")}
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)
    for engine, run in runs.items():
        req = run.json["requests"]
        assert run.json["generator"]["engine"] == engine
        assert (req["ok"], req["errors"]["protocol"]) == (ok, 6 - ok), (engine, req)
        (ex,) = req["error_examples"]["protocol"]
        assert ex["reason"].startswith("out of step: ") and ex["count"] == 6 - ok
        assert sorted(run.log["outcome"].tolist()) == ["ok"] * ok + ["protocol"] * (6 - ok)
        # one token each: only the streams still ok count, in the totals and the goodput
        assert (run.json["tokens"]["output"], req["good"]) == (ok, ok), (engine, run.json)
        assert run.json["throughput"]["requests_per_s"] == run.json["throughput"]["goodput_rps"]
    fast, py = runs["fast"].log, runs["python"].log
    assert fast["outcome"][np.argsort(fast["id"])].tolist() == \
        py["outcome"][np.argsort(py["id"])].tolist()


def test_a_loop_that_stopped_reading_for_its_json_says_so():
    """A stream faster than its chunks' JSON can be read (the endless one, 256 chunks a
    write): past 4 MiB of waiting events the compiled loop stops reading until they are
    taken, and chunks read together after that share one arrival time. The result counts
    the pauses and warns; a run that never got there reports none."""
    from support.bench_cli import errors
    from support.llm_server import ScriptedServer

    with ScriptedServer(modes=("endless_tokens",)) as srv:
        run = llm_run("fast", srv.base, "--max-tokens-per-stream", "400000", "--timeout",
                      "60s", n=1)
    gen = run.json["generator"]
    assert gen["engine"] == "fast", run.stderr
    assert errors(run.json) == {"too_large": 1}, run.json["requests"]
    assert gen["read_pauses"] >= 1 and gen["read_paused_s"] > 0, gen
    (warning,) = [w for w in run.json["warnings"] if "stopped reading" in w]
    assert warning.startswith(f"the generator stopped reading {gen['read_pauses']} times"), warning
    with ScriptedServer() as srv:
        calm = llm_run("fast", srv.base, n=20)
    assert calm.json["generator"]["read_pauses"] == 0, calm.json["generator"]
    assert not [w for w in calm.json["warnings"] if "stopped reading" in w]


class _SpacedChunks(ThreadedServer):
    """Each streamed response: a content chunk every ``gap_s`` (slept in the connection's
    own thread, precise to tens of µs), then [DONE]; keep-alive."""

    def __init__(self, chunks: int, gap_s: float) -> None:
        super().__init__()
        self.chunks, self.gap_s = chunks, gap_s

    def _serve(self, conn: socket.socket) -> None:
        # one chunk, one segment, sent when written
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buf += got
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n")
                              if x.lower().startswith(b"content-length:"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                conn.sendall(HEAD)
                for i in range(self.chunks):
                    conn.sendall(piece(tok("x", "length" if i == self.chunks - 1 else None)))
                    time.sleep(self.gap_s)
                conn.sendall(piece(DONE) + b"0\r\n\r\n")


def test_a_streams_chunks_are_read_as_they_come_though_whole_replies_may_wait():
    """The compiled loop may leave whole replies unread until its next send (DEFER_NS:
    their time is the kernel's receive stamp either way). Never a stream's chunks: chunks
    read together share the last one's stamp, and ITL would read 0. Chunks 0.4 ms apart at
    1,000 requests/s (a send due every ms, always within DEFER_NS) keep their gaps."""
    from support.bench_cli import bench

    with _SpacedChunks(chunks=8, gap_s=0.0004) as srv:
        run = bench(f"openai+http://127.0.0.1:{srv.port}/v1", "--engine", "fast",
                    "--model", "m", "--workload", "random", "--input-len", "8",
                    "--output-len", "8", "--rate", "1000", "--requests", "600",
                    "--timeout", "3s", "--workers", "1")
    assert run.json["requests"]["ok"] == 600, run.stderr
    itl = run.json["itl_ms"]
    assert itl["count"] == 600 * 7, itl
    assert itl["p50"] > 0.3, itl
