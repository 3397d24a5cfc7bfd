"""The openai+ protocol module (bench/openai_sse.py) byte by byte: the same response split
at every byte gives the same outcome and tokens; keep-alive carries the next request; each
way a stream can end maps to its kind. The connection is driven directly (it is sans-I/O
but for ``transport.write``, recorded here); the real sockets are tests/test_llm_*.py's."""

from __future__ import annotations

import json

import pytest

from tailgate.bench.openai_sse import OpenAIConnection
from tailgate.bench.outcome import KINDS


class Sink:
    def __init__(self) -> None:
        self.ended: list[tuple[int, str, int, str, tuple]] = []
        self.conn_errors: list[str] = []
        self.then = None  # called after each response (a keep-alive test sends the next)

    def on_response(self, conn, rid, outcome, status, nbytes, reason=""):
        first, toks, done, out, inp = conn.tokens()[:5]
        self.ended.append((rid, KINDS[outcome], status, reason, (len(toks), out, inp)))
        if self.then is not None:
            self.then(conn)

    def on_stale(self, conn, rid, reason):
        self.ended.append((rid, "stale_connection", 0, reason, ()))

    def on_conn_error(self, conn, kind, reason):
        self.conn_errors.append(reason)

    def on_closed(self, conn):
        pass


class Wire:
    """Where the connection writes (the request bytes) and whether it was dropped."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def abort(self) -> None:
        self.aborted = True


def chunk(obj: dict) -> bytes:
    ev = b"data: " + json.dumps(obj).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(ev), ev)


def stream(tokens: int = 3, usage: bool = True, done: bool = True, keep_alive: bool = True,
           chat: bool = False) -> bytes:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"Transfer-Encoding: chunked\r\n" + (b"" if keep_alive else b"Connection: close\r\n")
            + b"\r\n")
    body = b""
    if chat:
        body += chunk({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    for i in range(tokens):
        c = ({"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"})
        body += chunk({"choices": [{"index": 0, **c, "finish_reason": None}]})
    body += chunk({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    if usage:
        body += chunk({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens}})
    if done:
        body += b"e\r\ndata: [DONE]\n\n\r\n"
    return head + body + b"0\r\n\r\n"


def conn_for(api: str = "completions", requests=(b"REQ0", b"REQ1"), **kw):
    sink, wire = Sink(), Wire()
    conn = OpenAIConnection(sink, list(requests), api, **kw)
    conn.connection_made(wire)  # type: ignore[arg-type]
    return conn, sink, wire


def feed(conn, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        conn.data_received(data[i:i + step])


@pytest.mark.parametrize("chat", [False, True])
def test_every_split_gives_the_same_outcome_and_tokens(chat):
    data = stream(tokens=4, chat=chat)
    results = set()
    for step in (1, 2, 3, 7, 64, len(data)):
        conn, sink, wire = conn_for("chat" if chat else "completions")
        conn.send(0, 0.0)
        feed(conn, data, step)
        assert wire.sent == [b"REQ0"] and not wire.aborted
        (end,) = sink.ended
        results.add(end)
    assert results == {(0, "ok", 200, "", (4, 4, 7))}


def test_keep_alive_carries_the_next_request_with_its_own_bytes():
    conn, sink, wire = conn_for()
    sink.then = lambda c: c.send(1, 1.0) if len(sink.ended) == 1 else None
    conn.send(0, 0.0)
    feed(conn, stream(tokens=2), 5)
    feed(conn, stream(tokens=5, usage=False), 5)  # the answer to the request sent after it
    assert [e[:2] for e in sink.ended] == [(0, "ok"), (1, "ok")]
    assert sink.ended[1][4] == (5, -1, -1)  # no usage: the engine counts the chunks
    assert wire.sent == [b"REQ0", b"REQ1"] and conn.usable


@pytest.mark.parametrize("data,kind,reason", [
    (stream(done=False), "truncated", "the response ended before data: [DONE]"),
    (stream(tokens=0), "no_token", "the stream finished without any content"),
    (stream().replace(chunk({"choices": [{"index": 0, "text": " t1", "finish_reason": None}]}),
                      b"11\r\ndata: {not json\n\n\r\n"), "malformed_sse", "data is not JSON"),
    (stream().replace(b"text/event-stream; charset=utf-8", b"application/json\r\nX: y"),
     "protocol", "not an event stream (Content-Type application/json)"),
    (b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy", "status_5xx", "HTTP 503: busy"),
    (b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n", "protocol", "HTTP 302: "),
    (stream().replace(chunk({"choices": [{"index": 0, "text": " t1", "finish_reason": None}]}),
                      chunk({"error": {"message": "overloaded"}})), "server_error", "overloaded"),
])
def test_each_end_of_a_stream_has_its_kind(data, kind, reason):
    conn, sink, _ = conn_for()
    conn.send(0, 0.0)
    feed(conn, data, 11)
    (end,) = sink.ended
    assert end[1] == kind and end[3].startswith(reason), end


def test_a_finish_reason_ends_the_stream_only_when_asked():
    for require_done, kind in ((True, "truncated"), (False, "ok")):
        conn, sink, _ = conn_for(require_done=require_done)
        conn.send(0, 0.0)
        feed(conn, stream(done=False), 9)
        assert sink.ended[0][1] == kind


def test_an_event_past_its_limit_is_too_large_and_drops_the_connection():
    conn, sink, wire = conn_for(max_event=64)
    conn.send(0, 0.0)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    feed(conn, head + (b"data: " + b"x" * 20 + b"\n") * 10, 16)  # one event, 270 bytes
    (end,) = sink.ended
    assert end[1] == "too_large" and wire.aborted


def test_the_close_ends_a_close_delimited_stream():
    conn, sink, _ = conn_for()
    conn.send(0, 0.0)
    conn.data_received(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
                       b'data: {"choices":[{"text":" a"}]}\n\ndata: [DONE]\n\n')
    assert sink.ended == []  # the end of the response is the close
    conn.eof_received()
    assert sink.ended[0][:2] == (0, "ok")


def test_the_python_engine_keeps_each_chunks_engine_time_with_per_token_timings():
    """llama-server's timings in every chunk (timings_per_token): the engine's time of each
    content chunk (prompt_ms + predicted_ms), in order, beside its token time; a response
    without them keeps none."""
    def timed(obj: dict, pred: float) -> dict:
        return {**obj, "timings": {"prompt_n": 5, "cache_n": 0, "prompt_ms": 4.5,
                                   "predicted_n": 1, "predicted_ms": pred}}

    plain = stream(tokens=3)
    data = plain
    for i, pred in enumerate((0.001, 1.25, 2.5)):
        c = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
        data = data.replace(chunk(c), chunk(timed(c, pred)))
    for body, want in ((data, [4.501, 5.75, 7.0]), (plain, None)):
        conn, sink, _ = conn_for()
        seen: list = []
        sink.then = lambda c, seen=seen: seen.append(c.tokens())
        conn.send(0, 0.0)
        feed(conn, body, 13)
        (t,) = seen
        assert sink.ended[0][1] == "ok" and len(t[1]) == 3
        assert (t[8] if want is None else t[8].tolist()) == want
