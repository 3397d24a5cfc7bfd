"""A real OpenAI-compatible LLM server for tests: llama-cpp-python serving a tiny
random-weight Llama that :func:`write_tiny_gguf` writes with the ``gguf`` package.

The model is 2 layers, 64 wide, a 400-token vocabulary (about 0.5 MB):
it writes nonsense, fast, which is all a load test needs. Every token decodes
to printable ASCII (no byte-fallback tokens), so every generated token makes a
non-empty text chunk. The end-of-sequence token's output row is zero while the
others are scaled up, so generation runs to ``max_tokens`` in practice.

llama-cpp-python's server streams its first chunk with empty text, sends no
``usage`` chunk even when asked, and has no ``/metrics`` (MACHINE.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

MODEL_NAME = "tiny-random-llama"
# Pieces a prompt of lower-case words tokenises into: "▁" + letter starts a word.
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # UNKNOWN, CONTROL, CONTROL
    pieces = ["▁"] + [f"▁{c}" for c in _LETTERS] + list(_LETTERS) + list("0123456789.,?!")
    pieces += [f"▁{a}{b}" for a in "etaoin" for b in "etaoinshr"]
    tokens += pieces
    types += [1] * len(pieces)  # NORMAL
    scores = [0.0, 0.0, 0.0] + [-float(i) for i in range(len(pieces))]
    # Byte fallback, so any prompt (a chat template's "[INST]") tokenises; the model
    # never emits these (zero output rows), so its text stays printable ASCII.
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # BYTE
    scores += [0.0] * 256
    return tokens, scores, types


def write_tiny_gguf(path: str | os.PathLike[str], seed: int = 0,
                    context: int = 2048) -> Path:
    """Write the tiny random Llama GGUF to ``path`` and return it (trained context
    ``context`` tokens: what a server may give a slot)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab, n_embd, n_ff, n_layer, n_head = len(tokens), 64, 128, 2, 4
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(MODEL_NAME)
    w.add_context_length(context)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    out = rand(n_vocab, n_embd, scale=3.0)
    # Zero logit for </s> and the byte tokens, while the others spread over about +-60:
    # they are never sampled, so generation runs to max_tokens in printable ASCII.
    out[2] = 0.0
    out[[i for i, t in enumerate(types) if t == 6]] = 0.0
    w.add_tensor("output.weight", out)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cpp_available() -> str | None:
    """None when llama-cpp-python's server can be imported, else the reason."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        return f"llama-cpp-python[server] is not installed ({exc}); `make test` installs it"
    return None


ANY_REQUEST_ID = """
from starlette_context.plugins.base import PluginUUIDBase
PluginUUIDBase.validate_uuid = lambda self, value: None
from llama_cpp.server.__main__ import main
main()
"""


def _stop(proc: subprocess.Popen, log: IO[str]) -> None:
    """End a server this module started (SIGTERM, then SIGKILL after 10 s) and close its log."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


@contextlib.contextmanager
def llama_server(tmpdir: str | os.PathLike[str], startup_s: float = 120.0,
                 host: str = "127.0.0.1", cpu: str | None = None,
                 any_request_id: bool = False) -> Iterator[str]:
    """Start llama-cpp-python's OpenAI server on loopback (or ``host``, an address of a
    veth the test made), pinned to ``cpu`` when given; yield its base URL (``…/v1``). It
    logs the engine's timings of every completion to ``tmpdir``/llama-server.log.

    The server answers 400 to a request whose ``x-request-id`` is not a UUID (its
    middleware checks it); ``vllm bench serve`` sends ``bench-<hex>-<n>``, so
    ``any_request_id`` turns that check off for it."""
    model = write_tiny_gguf(Path(tmpdir) / "tiny.gguf")
    port = free_port()
    log = open(Path(tmpdir) / "llama-server.log", "w")  # noqa: SIM115 - closed below
    server = ["-c", ANY_REQUEST_ID] if any_request_id else ["-m", "llama_cpp.server"]
    proc = subprocess.Popen(
        [*(("taskset", "-c", cpu) if cpu is not None else ()),
         sys.executable, *server, "--model", str(model), "--host", host,
         "--port", str(port), "--interrupt_requests", "False", "--n_ctx", "2048",
         "--n_threads", "1", "--model_alias", MODEL_NAME, "--seed", "1"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://{host}:{port}/v1"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                log.flush()
                raise RuntimeError("llama server exited: "
                                   + (Path(tmpdir) / "llama-server.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(base + "/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama server not up within {startup_s:g} s")
            time.sleep(0.2)
        yield base
    finally:
        _stop(proc, log)


def native_llama_server_binary() -> str:
    """llama.cpp's native server (``make test`` builds it into the venv: the Makefile's
    LLAMA_SERVER); LLAMA_SERVER in the environment names another. Fails with the reason
    when it is not there (a missing tool is a failure, never a skip)."""
    path = os.environ.get("LLAMA_SERVER") or str(Path(sys.prefix) / "bin" / "llama-server")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"llama.cpp's native server is not at {path}: `make venv-test` "
                           "builds it from llama-cpp-python's vendored llama.cpp")
    return path


@contextlib.contextmanager
def native_llama_server(tmpdir: str | os.PathLike[str], slots: int = 1, ctx: int = 4096,
                        threads: int = 1, cpu: str | None = None,
                        extra: tuple[str, ...] = (), nice: int | None = None,
                        startup_s: float = 60.0, port: int | None = None
                        ) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start llama.cpp's native server (the C++ ``llama-server``) on loopback with the tiny
    random model, ``slots`` parallel slots of ``ctx`` tokens each, ``--metrics`` and
    ``--slots``; yield its base URL (``…/v1``) and its process (its pid for diagnose). Its
    log (with timestamps, every task's timings) goes to ``tmpdir``/llama-native.log.
    ``nice``: its scheduling priority (a scenario whose cause is the engine's own keeps the
    server ahead of the machine's other work, as it keeps it on a CPU of its own).
    ``port``: listen there (a server restarted on its predecessor's port), not a free one;
    its log then is ``llama-native-PORT-N.log``, one per start."""
    model = write_tiny_gguf(Path(tmpdir) / "tiny-native.gguf", context=ctx)
    log_path = Path(tmpdir) / "llama-native.log"
    if port is not None:
        n = len(list(Path(tmpdir).glob(f"llama-native-{port}-*.log")))
        log_path = Path(tmpdir) / f"llama-native-{port}-{n}.log"
    port = free_port() if port is None else port
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*(("taskset", "-c", cpu) if cpu is not None else ()),
         *(("nice", "-n", str(nice)) if nice is not None else ()),
         native_llama_server_binary(), "-m", str(model), "--host", "127.0.0.1",
         "--port", str(port), "-np", str(slots), "-c", str(ctx * slots), "-t", str(threads),
         "-tb", str(threads), "--metrics", "--slots", "--log-timestamps", "--log-prefix",
         "--alias", MODEL_NAME, "--seed", "1", "--no-webui",
         # a thread per connection tailgate's load may hold: cpp-httplib gives each accepted
         # connection a thread until its keep-alive ends (5 s, polling it every 10 ms), and
         # the load opens 16 before the run (bench --connections); with fewer HTTP threads a
         # request sent on a connection no thread holds yet waits up to 5 s unread (seen:
         # a run's first 8 requests waiting 0.6-4.8 s and read at once, "queued")
         "--threads-http", "32", *extra],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                log.flush()
                raise RuntimeError("llama-server exited: " + log_path.read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not up within {startup_s:g} s: "
                                   + log_path.read_text()[-2000:])
            time.sleep(0.1)
        yield base, proc
    finally:
        _stop(proc, log)


# -- a small scripted OpenAI-compatible server: real sockets, chosen faults ---------

FAULTS = ("ok", "status_500", "status_404", "reset_mid_stream", "bad_json", "bad_sse_line",
          "no_token", "hang", "error_object", "not_event_stream", "close_without_done",
          "eof_delimited", "eof_delimited_done", "interim_100", "short_content_length",
          "eof_mid_chunk", "rst_mid_stream", "upgrade")
# Not in FAULTS (a test of its own): "endless_event", data lines that never end an event;
# "event_error_json" / "event_error_text", one token then an SSE `event: error` whose data
# is JSON with a message / plain text; "endless_tokens", content chunks that never end;
# "big_event", a content chunk of BIG_EVENT bytes (data lines of 1,000,000 bytes: the
# JSON's padding, below the 1 MiB line limit; the event below the 16 MiB event limit).
ERROR_MESSAGE = "backend crashed: out of KV cache"
BIG_EVENT = 15_000_000
BIG_BODY = b"\n".join(
    [b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":" t0",'
     b'"finish_reason":"length"}],',
     *(b'data: "pad%d":"%s",' % (k, b"a" * 1_000_000) for k in range(BIG_EVENT // 1_000_000)),
     b'data: "end":0}']) + b"\n\ndata: [DONE]\n\n"
ENDLESS_TOKENS = 5_000_000  # an "endless" stream stops here (the client cuts it first)
# Modes whose response is completely framed: with keep_alive the connection then stays open.
KEEPS_ALIVE = ("ok", "big_event", "status_500", "status_404", "bad_json", "bad_sse_line", "no_token",
               "error_object", "not_event_stream", "close_without_done", "interim_100")


class ScriptedServer:
    """An asyncio HTTP/1.1 server on loopback speaking just enough of the OpenAI API.

    Request *n* (in order of arrival) gets behaviour ``modes[n % len(modes)]``;
    ``"ok"`` streams ``max_tokens`` content chunks ``gap_s`` apart (plus a usage
    chunk when ``stream_options.include_usage`` is asked). Token truth: with
    ``tokens_per_chunk`` k each content chunk carries k tokens (as speculative decoding
    sends them), listed in its ``logprobs`` when ``logprobs``, with a cumulative usage in
    every chunk when ``stream_options.continuous_usage_stats`` is asked; the usage chunk
    reports ``usage_skew`` more completion tokens than were streamed, and
    ``cached_tokens`` as ``prompt_tokens_details.cached_tokens``. Every request body is
    kept in ``bodies`` so a test can check what the client sent. It runs its own
    event loop in a thread; use it as a context manager.
    """

    def __init__(self, modes: tuple[str, ...] = ("ok",), gap_s: float = 0.001,
                 usage: bool = True, first_empty: bool = False,
                 keep_alive: bool = False, tokens_per_chunk: int = 1, logprobs: bool = False,
                 usage_skew: int = 0, cached_tokens: int | None = None,
                 serial_big: bool = True) -> None:
        import threading

        self.modes = modes
        self.gap_s = gap_s
        self.usage = usage
        self.first_empty = first_empty
        self.keep_alive = keep_alive  # answer the modes of KEEPS_ALIVE without closing
        self.tokens_per_chunk = tokens_per_chunk
        self.logprobs = logprobs
        self.usage_skew = usage_skew
        self.cached_tokens = cached_tokens
        self.serial_big = serial_big  # big_event: one response written at a time
        self.bodies: list[dict] = []
        self.heads: list[bytes] = []  # each request's header block, as received
        self.send_ns: list[list[int]] = []  # per ok request, when each content chunk was sent
        self._n = 0
        self.endless_sent = 0  # content chunks the endless_tokens mode wrote
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.port = 0

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _main(self) -> None:
        import asyncio

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._one_big = asyncio.Lock()
            self._hung: list = []
            srv = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = srv.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()
            for w in self._hung:
                w.close()
            srv.close()
            await srv.wait_closed()

        asyncio.run(main())

    async def _handle(self, reader, writer) -> None:
        while await self._one(reader, writer):
            pass

    async def _one(self, reader, writer) -> bool:
        """Answer one request; True when the connection stays open for the next one."""
        import asyncio
        import json as _json

        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = _json.loads(await reader.readexactly(length)) if length else {}
        except (asyncio.IncompleteReadError, ValueError, ConnectionError):
            writer.close()
            return False
        mode = self.modes[self._n % len(self.modes)]
        keep = self.keep_alive and mode in KEEPS_ALIVE
        close = b"" if keep else b"Connection: close\r\n"
        self._n += 1
        self.heads.append(head)
        self.bodies.append(body)
        chat = "messages" in body
        n_tokens = int(body.get("max_tokens", 4))

        opts = body.get("stream_options") or {}
        continuous = bool(opts.get("include_usage") and opts.get("continuous_usage_stats"))
        n_in = len(str(body.get("prompt") or body.get("messages")).split())

        def chunk(text: str | None, finish: str | None = None, pieces: list[str] | None = None,
                  so_far: int | None = None) -> bytes:
            if chat:
                delta = {} if text is None else {"content": text}
                ch = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                ch = {"index": 0, "text": text or "", "finish_reason": finish}
            if self.logprobs and pieces is not None:
                ch["logprobs"] = ({"content": [{"token": p, "logprob": -0.5} for p in pieces]}
                                  if chat else {"tokens": pieces,
                                                "token_logprobs": [-0.5] * len(pieces)})
            obj: dict = {"id": "x", "object": "chunk", "choices": [ch]}
            if continuous and so_far is not None:
                obj["usage"] = {"prompt_tokens": n_in, "completion_tokens": so_far,
                                "total_tokens": n_in + so_far}
            return b"data: " + _json.dumps(obj).encode() + b"\n\n"

        def head_(status: str, ctype: bytes = b"text/event-stream") -> bytes:
            return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + ctype
                    + b"\r\nTransfer-Encoding: chunked\r\n" + close + b"\r\n")

        def piece(data: bytes) -> bytes:  # one HTTP chunk
            return b"%x\r\n%s\r\n" % (len(data), data)

        try:
            if mode in ("status_500", "status_404"):
                code = "500 Internal Server Error" if mode == "status_500" else "404 Not Found"
                msg = b'{"error": {"message": "scripted failure"}}'
                writer.write(b"HTTP/1.1 " + code.encode() + b"\r\nContent-Type: application/json"
                             b"\r\nContent-Length: " + str(len(msg)).encode()
                             + b"\r\n" + close + b"\r\n" + msg)
            elif mode == "upgrade":
                writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\n\r\n\x81\x05hello")
                await writer.drain()
                await asyncio.sleep(0.05)
            elif mode == "endless_event":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Connection: close\r\n\r\n")
                line = b"data: " + b"x" * 65536 + b"\n"
                for _ in range(16384):  # 1 GiB at most; the client cuts it long before
                    writer.write(line)
                    await writer.drain()
            elif mode == "big_event":
                # serial_big: one response written at a time, across connections (the
                # client then holds part of few: the one written, and the tails of the ones
                # before that the loopback buffers still hold)
                async with self._one_big if self.serial_big else contextlib.nullcontext():
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Content-Length: %d\r\n%s\r\n" % (len(BIG_BODY), close))
                    writer.write(BIG_BODY)
                    await writer.drain()
            elif mode in ("event_error_json", "event_error_text"):
                writer.write(head_("200 OK") + piece(chunk(" t0")))
                data = (_json.dumps({"message": ERROR_MESSAGE, "code": 500})
                        if mode == "event_error_json" else ERROR_MESSAGE)
                writer.write(piece(b"event: error\ndata: " + data.encode() + b"\n\n"))
                writer.write(b"0\r\n\r\n")
            elif mode == "endless_tokens":
                writer.write(head_("200 OK"))
                batch = b"".join(piece(chunk(" t")) for _ in range(256))
                for _ in range(ENDLESS_TOKENS // 256):
                    writer.write(batch)
                    await writer.drain()
                    self.endless_sent += 256
            elif mode == "hang":
                writer.write(head_("200 OK"))
                await writer.drain()
                self._hung.append(writer)
                await self._stop.wait()
                return False
            elif mode == "not_event_stream":
                msg = b'{"choices": [{"text": "whole answer"}]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: " + str(len(msg)).encode()
                             + b"\r\n" + close + b"\r\n" + msg)
            else:
                # HTTP/1.0 style: no length, ends at close (the same for a short length)
                eof = mode in ("eof_delimited", "eof_delimited_done", "short_content_length")
                if mode == "interim_100":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                if mode == "short_content_length":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Content-Length: 100000\r\n\r\n")
                elif eof:
                    writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
                else:
                    writer.write(head_("200 OK"))
                if eof:
                    def piece(data: bytes) -> bytes:
                        return data
                if chat:
                    writer.write(piece(chunk(None)))  # the role-only first chunk
                if self.first_empty and not chat:
                    writer.write(piece(chunk("")))
                sends: list[int] = []
                tokens = 0 if mode == "no_token" else n_tokens
                k = self.tokens_per_chunk
                for i in range((tokens + k - 1) // k):
                    if mode == "reset_mid_stream" and i == max(1, tokens // 2):
                        writer.transport.abort()
                        return False
                    if mode == "bad_json" and i == 1:
                        writer.write(piece(b"data: {not json\n\n"))
                    if mode == "bad_sse_line" and i == 1:
                        writer.write(piece(b"data: \xff\xfe broken utf-8\n\n"))
                    await asyncio.sleep(self.gap_s)
                    sends.append(time.perf_counter_ns())
                    mine = [f" t{j}" for j in range(i * k, min((i + 1) * k, tokens))]
                    writer.write(piece(chunk("".join(mine), pieces=mine,
                                             so_far=min((i + 1) * k, tokens))))
                    await writer.drain()
                if mode == "error_object":
                    writer.write(piece(b'data: {"error": {"message": "engine overloaded"}}\n\n'))
                writer.write(piece(chunk(None if chat else "", "length")))
                want_usage = opts.get("include_usage")
                if self.usage and want_usage:
                    said = tokens + self.usage_skew
                    u = {"id": "x", "choices": [], "usage": {
                        "prompt_tokens": n_in, "completion_tokens": said,
                        "total_tokens": n_in + said}}
                    if self.cached_tokens is not None:
                        u["usage"]["prompt_tokens_details"] = {
                            "cached_tokens": min(self.cached_tokens, n_in)}
                    writer.write(piece(b"data: " + _json.dumps(u).encode() + b"\n\n"))
                if mode == "eof_mid_chunk":
                    writer.write(b"40\r\ndata: [DO")  # the close cuts the last chunk
                    await writer.drain()
                    return False
                if mode == "rst_mid_stream":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return False
                if mode not in ("close_without_done", "eof_delimited", "short_content_length"):
                    writer.write(piece(b"data: [DONE]\n\n"))
                if not eof:
                    # close_without_done: the finish chunk was sent, and a complete
                    # response without [DONE] is fine.
                    writer.write(b"0\r\n\r\n")
                if mode in ("ok", "interim_100", "eof_delimited_done"):
                    self.send_ns.append(sends)
            await writer.drain()
        except ConnectionError:
            keep = False
        finally:
            if mode != "hang" and not keep:
                writer.close()
        return keep
