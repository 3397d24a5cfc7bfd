"""The sans-I/O HTTP/1.1 response reader and TCP framer: every framing rule, fed whole
and one byte at a time (the result must not depend on how the bytes were split)."""

from __future__ import annotations

import pytest

from tailgate.bench.http1 import (
    Data,
    End,
    FramingError,
    Head,
    Informational,
    Limits,
    ResponseReader,
    Unsolicited,
    parse_head,
)
from tailgate.bench.tcp import TcpReader


def whole(msg: bytes) -> list[bytes]:
    return [msg]


def bytewise(msg: bytes) -> list[bytes]:
    return [msg[i:i + 1] for i in range(len(msg))]


SPLITS = pytest.mark.parametrize("split", [whole, bytewise], ids=["whole", "bytewise"])


def read(split, msg: bytes, *, head: bool = False, eof: bool = False,
         limits: Limits | None = None) -> list[tuple]:
    """Feed ``msg`` (split) to a fresh reader; a summary of its events, an error last."""
    r = ResponseReader(limits, keep_body=True)
    r.expect(head)
    events = []
    try:
        for piece in split(msg):
            events += r.feed(piece)
        if eof:
            events += r.feed_eof()
    except FramingError as err:
        events.append(err)
    out: list[tuple] = []
    for ev in events:
        if isinstance(ev, Data) and out and out[-1][0] == "body":
            out[-1] = ("body", out[-1][1] + ev.data)
        elif isinstance(ev, Unsolicited) and out and out[-1][0] == "unsolicited":
            out[-1] = ("unsolicited", out[-1][1] + ev.data)
        elif isinstance(ev, Data):
            out.append(("body", ev.data))
        elif isinstance(ev, Unsolicited):
            out.append(("unsolicited", ev.data))
        elif isinstance(ev, Informational):
            out.append(("info", ev.status))
        elif isinstance(ev, Head):
            out.append(("head", ev.status, ev.keep_alive))
        elif isinstance(ev, End):
            out.append(("end", ev.status, ev.keep_alive, ev.body_bytes))
        else:
            out.append(("error", ev.kind))
    return out


@SPLITS
def test_content_length_body_keep_alive(split):
    msg = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nServer: x\r\n\r\nhello"
    assert read(split, msg) == [("head", 200, True), ("body", b"hello"), ("end", 200, True, 5)]


@SPLITS
def test_interim_1xx_responses_are_skipped_and_the_final_one_ends(split):
    msg = (b"HTTP/1.1 100 Continue\r\n\r\n"
           b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
           b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert read(split, msg) == [("info", 100), ("info", 103), ("head", 200, True),
                                ("body", b"ok"), ("end", 200, True, 2)]


@SPLITS
def test_close_delimited_body_is_complete_at_eof(split):
    msg = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"
    assert read(split, msg) == [("head", 200, False), ("body", b"all of it")]  # not yet
    assert read(split, msg, eof=True) == [("head", 200, False), ("body", b"all of it"),
                                          ("end", 200, False, 9)]
    close11 = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc"
    assert read(split, close11, eof=True)[-1] == ("end", 200, False, 3)


@SPLITS
def test_http10_keep_alive_only_when_asked(split):
    msg = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx"
    assert read(split, msg)[-1] == ("end", 200, True, 1)
    msg = b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx"
    assert read(split, msg)[-1] == ("end", 200, False, 1)
    msg = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 1\r\n\r\nx"
    assert read(split, msg)[-1] == ("end", 200, False, 1)


@SPLITS
def test_chunked_with_extensions_and_trailers(split):
    msg = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;name=value\r\nhello\r\n1 ; x\r\n \r\nA\r\n0123456789\r\n"
           b"0\r\nChecksum: 1\r\nOther: 2\r\n\r\n")
    assert read(split, msg) == [("head", 200, True), ("body", b"hello 0123456789"),
                                ("end", 200, True, 16)]


@SPLITS
def test_transfer_encoding_wins_over_content_length_and_retires_the_connection(split):
    msg = (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"6\r\nabcdef\r\n0\r\n\r\n")
    assert read(split, msg) == [("head", 200, False), ("body", b"abcdef"),
                                ("end", 200, False, 6)]


@SPLITS
def test_non_chunked_final_coding_reads_to_the_close(split):
    msg = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8b..."
    assert read(split, msg, eof=True) == [("head", 200, False), ("body", b"\x1f\x8b..."),
                                          ("end", 200, False, 5)]
    bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
    assert read(split, bad)[-1] == ("error", "protocol")


@SPLITS
def test_transfer_encoding_in_http10_is_faulty_framing(split):
    msg = b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert read(split, msg) == [("error", "protocol")]


@SPLITS
@pytest.mark.parametrize("status", [204, 304])
def test_no_body_statuses_and_head_ignore_content_length(split, status):
    msg = b"HTTP/1.1 %d X\r\nContent-Length: 100\r\n\r\n" % status
    assert read(split, msg) == [("head", status, True), ("end", status, True, 0)]
    chunked = b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % status
    assert read(split, chunked)[-1] == ("end", status, True, 0)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    assert read(split, head, head=True) == [("head", 200, True), ("end", 200, True, 0)]
    # A body the server sends anyway belongs to no request.
    assert read(split, head + b"body", head=True)[-1] == ("unsolicited", b"body")


@SPLITS
def test_upgrade_nobody_asked_for_is_its_own_error(split):
    msg = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    assert read(split, msg + b"\x81\x05hello") == [("error", "upgrade")]


@SPLITS
def test_bytes_after_the_response_are_unsolicited_never_the_next_response(split):
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno"
    msg = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes" + second
    assert read(split, msg) == [("head", 200, True), ("body", b"yes"), ("end", 200, True, 3),
                                ("unsolicited", second)]
    r = ResponseReader()  # idle: nothing expected at all
    (ev,) = r.feed(b"\r\n")
    assert isinstance(ev, Unsolicited) and "with no request in flight" in ev.describe()


@SPLITS
def test_truncated_streams(split):
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    assert read(split, short, eof=True)[-1] == ("error", "truncated")
    mid_chunk = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
    assert read(split, mid_chunk, eof=True)[-1] == ("error", "truncated")
    no_last = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"
    assert read(split, no_last, eof=True)[-1] == ("error", "truncated")
    in_trailer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: 1\r\n"
    assert read(split, in_trailer, eof=True)[-1] == ("error", "truncated")
    in_head = b"HTTP/1.1 200 OK\r\nContent-Le"
    assert read(split, in_head, eof=True) == [("error", "truncated")]
    after_interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    assert read(split, after_interim, eof=True) == [("info", 100), ("error", "truncated")]


def test_eof_before_any_byte_is_closed_not_truncated():
    r = ResponseReader()
    r.expect()
    with pytest.raises(FramingError) as err:
        r.feed_eof()
    assert err.value.kind == "closed"
    idle = ResponseReader()
    assert idle.feed_eof() == []  # a server closing an idle connection: no error


SMALL = Limits(max_header_bytes=1024, max_line_bytes=64, max_body_bytes=4096)


@SPLITS
def test_every_buffer_is_bounded(split):
    endless_header = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 2000
    assert read(split, endless_header, limits=SMALL) == [("error", "too_large")]
    many_fields = b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 300
    assert read(split, many_fields, limits=SMALL) == [("error", "too_large")]
    big_cl = b"HTTP/1.1 200 OK\r\nContent-Length: 4097\r\n\r\n"
    assert read(split, big_cl, limits=SMALL) == [("error", "too_large")]
    big_chunks = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + (
        b"400\r\n" + b"x" * 1024 + b"\r\n") * 5
    assert read(split, big_chunks, limits=SMALL)[-1] == ("error", "too_large")
    long_size_line = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;" + b"e" * 100
    assert read(split, long_size_line, limits=SMALL)[-1] == ("error", "too_large")
    eof_body = b"HTTP/1.0 200 OK\r\n\r\n" + b"z" * 5000
    assert read(split, eof_body, limits=SMALL)[-1] == ("error", "too_large")
    trailers = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"T: v\r\n" * 300
    assert read(split, trailers, limits=SMALL)[-1] == ("error", "too_large")


def test_a_limit_below_64_bytes_is_refused():
    with pytest.raises(ValueError, match="max_body_bytes"):
        Limits(max_body_bytes=10)


@SPLITS
@pytest.mark.parametrize("msg", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    b"HTTP/1.1 20 OK\r\n\r\n",
    b"\r\nHTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nName : x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n folded first\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
    b"HTTP/1.1 099 Low\r\n\r\n",
], ids=lambda m: m[:40].decode("latin-1"))
def test_malformed_responses_are_protocol_errors(split, msg):
    assert read(split, msg)[-1] == ("error", "protocol")


@SPLITS
def test_lenient_where_rfc_9112_allows(split):
    # Bare LF line ends, an empty reason phrase, a fold, a list of equal lengths.
    msg = b"HTTP/1.1 200\nX-Folded: a\n  b\nContent-Length: 2, 2\n\nhi"
    assert read(split, msg) == [("head", 200, True), ("body", b"hi"), ("end", 200, True, 2)]
    assert parse_head(b"HTTP/1.1 200 \r\nX-Folded: a\r\n\tb")[2] == [(b"x-folded", b"a b")]
    assert read(split, b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n") == [
        ("head", 404, True), ("end", 404, True, 0)]


def test_one_reader_serves_a_connection_one_response_at_a_time():
    r = ResponseReader()
    for i in range(3):
        r.expect()
        evs = r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%d" % i)
        assert [type(e) for e in evs] == [Head, End]
    r.expect()
    with pytest.raises(RuntimeError, match="no pipelining"):
        r.expect()


def test_header_search_is_linear_when_fed_byte_by_byte():
    # The blank-line search resumes where it stopped: 200 KiB in single bytes stays quick.
    r = ResponseReader()
    r.expect()
    for b in b"HTTP/1.1 200 OK\r\n" + b"X: " + b"v" * 200_000:
        assert r.feed(bytes([b])) == []
    assert r.state != 0


# -- TCP --------------------------------------------------------------------------------

@SPLITS
def test_tcp_delimiter_split_across_reads_and_bytes_after_it(split):
    r = TcpReader(b"\r\n\r\n", None)
    r.expect()
    results = [r.feed(p) for p in split(b"pong\r\n\r\nXY")]
    done = [i for i, (ok, _) in enumerate(results) if ok]
    assert len(done) == 1
    extra = b"".join(e for _, e in results[done[0]:])
    assert extra == b"XY" and r.got == 8
    assert r.feed(b"more") == (False, b"more")  # idle: everything is extra


@SPLITS
def test_tcp_length_and_its_overrun(split):
    r = TcpReader(None, 4)
    r.expect()
    results = [r.feed(p) for p in split(b"abcdEF")]
    assert [ok for ok, _ in results].count(True) == 1
    assert b"".join(e for _, e in results) == b"EF"


def test_tcp_truncated_closed_and_too_large():
    r = TcpReader(b"\n", None, max_bytes=100)
    r.expect()
    with pytest.raises(FramingError) as err:
        r.feed_eof()
    assert err.value.kind == "closed"
    r.expect()
    r.feed(b"partial")
    with pytest.raises(FramingError) as err:
        r.feed_eof()
    assert err.value.kind == "truncated" and "after 7 bytes" in err.value.reason
    r.expect()
    with pytest.raises(FramingError) as err:
        for _ in range(20):
            r.feed(b"x" * 10)
    assert err.value.kind == "too_large"


# -- one codec table, both engines (issue 23) -----------------------------------------------
# Each case through the Python engine's connection classes and the compiled loop's own
# framing (tailgate.bench.framing: bytes in, the request's outcome out, no socket), whole
# and one byte at a time: the two must agree on everything (outcome, status, bytes,
# reason, what is charged to the connection, whether it stays usable), and the outcome
# is the one the case names.

CL = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def _sse_piece(data: bytes) -> bytes:  # one HTTP chunk
    return b"%x\r\n%s\r\n" % (len(data), data)


def _tok(text: str, finish: str | None = None, chat: bool = False) -> bytes:
    import json

    choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
              else {"index": 0, "text": text, "finish_reason": finish})
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
DONE = _sse_piece(b"data: [DONE]\n\n")
END = b"0\r\n\r\n"
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
TWO = _sse_piece(_tok(" a")) + _sse_piece(_tok(" b", "length"))
# openai+http:// streams (issue 27): the HTTP framing and the event stream of the Python
# engine's OpenAIConnection against the compiled loop's scanner (its JSON read by
# bench/fast_sse.py): (id, bytes, options, the outcome)
SSE_TABLE: list[tuple[str, bytes, dict, str | None]] = [
    ("ok", SSE_HEAD + TWO + _sse_piece(USAGE) + DONE + END, {}, "ok"),
    ("chat", SSE_HEAD + _sse_piece(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
     + _sse_piece(_tok("hi", chat=True)) + DONE + END, {"api": "chat"}, "ok"),
    ("content-length", b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
     b"Content-Length: %d\r\n\r\n" % (len(_tok(" a")) + 14) + _tok(" a") + b"data: [DONE]\n\n",
     {}, "ok"),
    ("eof-delimited", b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
     + _tok(" a") + b"data: [DONE]\n\n", {"eof": True}, "ok"),
    ("eof-delimited-open", b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
     + _tok(" a") + b"data: [DONE]\n\n", {}, None),
    ("interim", b"HTTP/1.1 100 Continue\r\n\r\n" + SSE_HEAD + TWO + DONE + END, {}, "ok"),
    ("crlf-and-cr", SSE_HEAD + _sse_piece(b'data: {"choices":[{"text":"x"}]}\r\n\r')
     + _sse_piece(b'\ndata: {"choices":[{"text":"y"}]}\r\rdata: [DONE]\r\n\r\n') + END, {},
     "ok"),
    ("comments-ids-retry", SSE_HEAD + _sse_piece(b": keep-alive\n\nid: 7\nretry: 10\n"
                                                 b"event: message\nbogus\n" + _tok(" a"))
     + DONE + END, {}, "ok"),
    ("multiline-data", SSE_HEAD + _sse_piece(b'data: {"choices":\ndata: [{"text":"x"}]}\n\n')
     + DONE + END, {}, "ok"),
    ("one-chunk-many-events", SSE_HEAD + _sse_piece(_tok(" a") + _tok(" b") + USAGE
                                                    + b"data: [DONE]\n\n") + END, {}, "ok"),
    ("split-events", SSE_HEAD + _sse_piece(_tok(" a")[:9]) + _sse_piece(_tok(" a")[9:])
     + DONE + END, {}, "ok"),
    ("bytes-after-done", SSE_HEAD + TWO + DONE + _sse_piece(b"\xff garbage {\n\n") + END, {},
     "ok"),
    ("ctype-case-params", SSE_HEAD.replace(b"text/event-stream", b"Text/Event-Stream; "
                                           b"charset=utf-8") + TWO + DONE + END, {}, "ok"),
    ("ctype-empty", SSE_HEAD.replace(b"text/event-stream", b"") + TWO + DONE + END, {}, "ok"),
    ("no-ctype", SSE_HEAD.replace(b"Content-Type: text/event-stream\r\n", b"") + TWO + DONE
     + END, {}, "ok"),
    ("no-token", SSE_HEAD + _sse_piece(_tok("", "length")) + DONE + END, {}, "no_token"),
    ("bad-json", SSE_HEAD + _sse_piece(_tok(" a")) + _sse_piece(b"data: {not json\n\n") + TWO
     + DONE + END, {}, "malformed_sse"),
    ("no-choices", SSE_HEAD + _sse_piece(b'data: {"id": 1}\n\n') + DONE + END, {},
     "malformed_sse"),
    ("not-an-object", SSE_HEAD + _sse_piece(b"data: [1, 2]\n\n") + DONE + END, {},
     "malformed_sse"),
    ("not-utf8", SSE_HEAD + _sse_piece(_tok(" a")) + _sse_piece(b"data: \xff\xfe broken\n\n")
     + DONE + END, {}, "malformed_sse"),
    ("not-utf8-field", SSE_HEAD + _sse_piece(b"ev\xc3\x28nt: x\n") + TWO + DONE + END, {},
     "malformed_sse"),
    ("overlong-utf8", SSE_HEAD + _sse_piece(b"data: \xc0\xafx\n\n") + DONE + END, {},
     "malformed_sse"),
    ("utf8-ok", SSE_HEAD + _sse_piece(_tok(" \u00e9\u4e2d\U0001f600")) + _sse_piece(
        'data: {"choices":[{"text":"é中😀"}]}\n\n'.encode()) + DONE + END, {}, "ok"),
    ("error-event-json", SSE_HEAD + _sse_piece(_tok(" a")) + _sse_piece(
        b'event: error\ndata: {"message": "out of KV cache", "code": 500}\n\n') + END, {},
     "server_error"),
    ("error-event-text", SSE_HEAD + _sse_piece(b"event: error\ndata: backend died\n\n") + END,
     {}, "server_error"),
    ("error-object", SSE_HEAD + _sse_piece(_tok(" a")) + _sse_piece(
        b'data: {"error": {"message": "engine overloaded"}}\n\n') + DONE + END, {},
     "server_error"),
    ("ends-before-done", SSE_HEAD + TWO + END, {}, "truncated"),
    ("ends-before-done-allowed", SSE_HEAD + TWO + END, {"require_done": False}, "ok"),
    ("ends-inside-event", SSE_HEAD + TWO + _sse_piece(b"data: {") + END, {"require_done": False},
     "truncated"),
    ("ends-without-finish", SSE_HEAD + _sse_piece(_tok(" a")) + END, {"require_done": False},
     "truncated"),
    ("eof-mid-chunk", SSE_HEAD + TWO + b"40\r\ndata: [DO", {"eof": True}, "truncated"),
    ("eof-before-done", b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + _tok(" a"),
     {"eof": True}, "truncated"),
    ("framing-error-after-tokens", SSE_HEAD + TWO + b"zz\r\n", {}, "protocol"),
    ("status-500", b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
     b'Content-Length: 42\r\n\r\n{"error": {"message": "scripted failure"}}', {}, "status_5xx"),
    ("status-404", b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope", {},
     "status_4xx"),
    ("status-302", b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n", {}, "protocol"),
    ("status-201", SSE_HEAD.replace(b"200 OK", b"201 Created") + TWO + DONE + END, {},
     "protocol"),
    ("status-500-cut", b"HTTP/1.1 500 X\r\nContent-Length: 900\r\n\r\n\xffpartial " + b"e" * 400,
     {"eof": True}, "status_5xx"),
    ("not-event-stream", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
     b'Content-Length: 2\r\n\r\n{}', {}, "protocol"),
    ("not-event-stream-empty", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
     b"Content-Length: 0\r\n\r\n", {}, "protocol"),
    ("upgrade", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81", {},
     "upgrade"),
    ("unsolicited-after", SSE_HEAD + TWO + DONE + END + b"HTTP/1.1 200 OK\r\n\r\n", {}, "ok"),
    ("event-too-large", SSE_HEAD + _sse_piece(b"data: " + b"x" * 40 + b"\ndata: " + b"y" * 40
                                              + b"\n\n") + END, {"max_event": 64}, "too_large"),
    ("event-at-its-limit", SSE_HEAD + _sse_piece(b'data: {"choices":[{"text":"z"}]}\n\n')
     + DONE + END, {"max_event": 34}, "ok"),
    ("tokens-past-limit", SSE_HEAD + TWO + _sse_piece(_tok(" c")) + DONE + END,
     {"max_tokens": 2}, "too_large"),
    ("tokens-at-limit", SSE_HEAD + TWO + DONE + END, {"max_tokens": 2}, "ok"),
    ("eof-before-any-byte", b"", {"eof": True}, "reset"),
]
# (id, kind, bytes, options, the outcome)
TABLE: list[tuple[str, str, bytes, dict, str | None]] = [
    ("content-length", "http", CL, {}, "ok"),
    ("interim", "http", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: <a>"
     b"\r\n\r\n" + CL, {}, "ok"),
    ("eof-delimited", "http", b"HTTP/1.0 200 OK\r\n\r\nall of it", {"eof": True}, "ok"),
    ("eof-delimited-open", "http", b"HTTP/1.0 200 OK\r\n\r\nnot yet", {}, None),
    ("http10-keep-alive", "http", b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\n"
     b"Content-Length: 1\r\n\r\nx", {}, "ok"),
    ("close-listed", "http", b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n"
     b"Content-Length: 1\r\n\r\nx", {}, "ok"),
    ("chunked-ext-trailer", "http", CHUNKED + b"5;name=value\r\nhello\r\n1 ; x\r\n \r\n"
     b"0\r\nChecksum: 1\r\n\r\n", {}, "ok"),
    ("te-beats-cl", "http", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: "
     b"chunked\r\n\r\n6\r\nabcdef\r\n0\r\n\r\n", {}, "ok"),
    ("gzip-to-close", "http", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8b",
     {"eof": True}, "ok"),
    ("204-ignores-cl", "http", b"HTTP/1.1 204 X\r\nContent-Length: 100\r\n\r\n", {}, "ok"),
    ("head-ignores-cl", "http", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
     {"head": True}, "ok"),
    ("head-then-body", "http", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nbody",
     {"head": True}, "ok"),
    ("unsolicited", "http", CL + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno", {}, "ok"),
    ("404", "http", b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n", {}, "status_4xx"),
    ("503", "http", b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy", {}, "status_5xx"),
    ("lenient-lf-fold-list", "http", b"HTTP/1.1 200\nX-Folded: a\n  b\nContent-Length: 2, 2"
     b"\n\nhi", {}, "ok"),
    ("upgrade", "http", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
     b"Connection: Upgrade\r\n\r\n\x81\x05hello", {}, "upgrade"),
    ("chunked-then-gzip", "http", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip"
     b"\r\n\r\n", {}, "protocol"),
    ("te-in-http10", "http", b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     {}, "protocol"),
    ("http2", "http", b"HTTP/2 200 OK\r\n\r\n", {}, "protocol"),
    ("ssh", "http", b"SSH-2.0-OpenSSH_9.6\r\n\r\n", {}, "protocol"),
    ("short-status", "http", b"HTTP/1.1 20 OK\r\n\r\n", {}, "protocol"),
    ("leading-blank", "http", b"\r\nHTTP/1.1 200 OK\r\n\r\n", {}, "protocol"),
    ("cl-abc", "http", b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", {}, "protocol"),
    ("cl-twice", "http", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6"
     b"\r\n\r\n", {}, "protocol"),
    ("cl-negative", "http", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", {}, "protocol"),
    ("bad-name", "http", b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", {}, "protocol"),
    ("space-before-colon", "http", b"HTTP/1.1 200 OK\r\nName : x\r\n\r\n", {}, "protocol"),
    ("no-colon", "http", b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", {}, "protocol"),
    ("fold-first", "http", b"HTTP/1.1 200 OK\r\n folded first\r\n\r\n", {}, "protocol"),
    ("chunk-size-zz", "http", CHUNKED + b"zz\r\n", {}, "protocol"),
    ("chunk-overrun", "http", CHUNKED + b"2\r\nabc\r\n", {}, "protocol"),
    ("status-099", "http", b"HTTP/1.1 099 Low\r\n\r\n", {}, "protocol"),
    ("short-cl", "http", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", {"eof": True},
     "truncated"),
    ("eof-mid-chunk", "http", CHUNKED + b"5\r\nab", {"eof": True}, "truncated"),
    ("eof-no-last-chunk", "http", CHUNKED + b"2\r\nab\r\n", {"eof": True}, "truncated"),
    ("eof-in-trailer", "http", CHUNKED + b"0\r\nX: 1\r\n", {"eof": True}, "truncated"),
    ("eof-in-head", "http", b"HTTP/1.1 200 OK\r\nContent-Le", {"eof": True}, "truncated"),
    ("eof-after-interim", "http", b"HTTP/1.1 100 Continue\r\n\r\n", {"eof": True},
     "truncated"),
    ("eof-before-any-byte", "http", b"", {"eof": True}, "reset"),
    ("endless-header", "http", b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 2000,
     {"limits": SMALL}, "too_large"),
    ("many-fields", "http", b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 300, {"limits": SMALL},
     "too_large"),
    ("big-cl", "http", b"HTTP/1.1 200 OK\r\nContent-Length: 4097\r\n\r\n", {"limits": SMALL},
     "too_large"),
    ("big-chunks", "http", CHUNKED + (b"400\r\n" + b"x" * 1024 + b"\r\n") * 5,
     {"limits": SMALL}, "too_large"),
    ("long-size-line", "http", CHUNKED + b"1;" + b"e" * 100, {"limits": SMALL}, "too_large"),
    ("big-eof-body", "http", b"HTTP/1.0 200 OK\r\n\r\n" + b"z" * 5000, {"limits": SMALL},
     "too_large"),
    ("big-trailers", "http", CHUNKED + b"0\r\n" + b"T: v\r\n" * 300, {"limits": SMALL},
     "too_large"),
    ("tcp-delimiter", "tcp", b"pong\r\n\r\n", {"delimiter": b"\r\n\r\n"}, "ok"),
    ("tcp-extra", "tcp", b"pong\r\n\r\nXY", {"delimiter": b"\r\n\r\n"}, "ok"),
    ("tcp-length", "tcp", b"abcd", {"response_length": 4}, "ok"),
    ("tcp-length-overrun", "tcp", b"abcdEF", {"response_length": 4}, "ok"),
    ("tcp-open", "tcp", b"abc", {"response_length": 4}, None),
    ("tcp-truncated", "tcp", b"partial", {"delimiter": b"\n", "eof": True}, "truncated"),
    ("tcp-closed", "tcp", b"", {"delimiter": b"\n", "eof": True}, "reset"),
    ("tcp-too-large", "tcp", b"x" * 5000, {"delimiter": b"\n", "limits": SMALL}, "too_large"),
    *[(f"sse-{name}", "openai", msg, opts, want) for name, msg, opts, want in SSE_TABLE],
]


@SPLITS
@pytest.mark.parametrize(("kind", "msg", "opts", "want"), [c[1:] for c in TABLE],
                         ids=[c[0] for c in TABLE])
def test_both_engines_frame_every_case_alike(split, kind, msg, opts, want):
    from tailgate.bench.framing import frame, frame_fast

    py = frame(kind, split(msg), **opts)
    fast = frame_fast(kind, split(msg), **opts)
    assert py == fast
    assert py.outcome == want, py
