"""Resets from misbehaving servers (issue 48), through the real command on both engines.

1. A server that answers a POST whole after its header block and then resets the
   connection with the 8 MiB body unread: the client's write fails (ECONNRESET or EPIPE)
   while the answer waits readable in its receive buffer. RFC 9112 9.5: a client keeps
   reading while it sends; what the kernel already holds is read and framed before the
   connection is declared dead, so each such request is ``ok``, on both engines, every
   run (before: ``reset`` for 0-20 of 20, by timing).
2. A server that resets every connection at accept: the TCP handshake was done (the
   client's connect completed; a refusal is ECONNREFUSED), so every request is ``reset``,
   never ``connect`` (before: the Python engine counted a reset seen when its connect
   completed as ``connect``, "[Errno 104] Connection reset by peer").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.accounting import accounted
from support.misbehaving import Misbehaving

pytestmark = pytest.mark.timeout(120)

TAILGATE = [sys.executable, "-m", "tailgate", "bench", "--quiet", "--workers", "1"]


@pytest.fixture(params=["fast", "python"])
def engine(request):
    return request.param


def bench(tmp: Path, url: str, engine: str, *args: str) -> dict:
    out = tmp / f"out-{engine}.json"
    r = subprocess.run([*TAILGATE, url, "--engine", engine, "--json", str(out), *args],
                       capture_output=True, text=True, timeout=90)
    assert out.exists(), r.stderr + r.stdout
    data = json.loads(out.read_text())
    assert data["generator"]["engine"] == engine
    return data


def test_a_whole_answer_before_a_reset_mid_upload_is_ok(tmp_path, engine):
    body = tmp_path / "body.bin"
    body.write_bytes(b"b" * (8 << 20))
    with Misbehaving("answer_reset") as srv:
        data = bench(tmp_path, srv.url, engine, "-X", "POST", "--body-file", str(body),
                     "--rate", "40", "--duration", "0.5s", "--timeout", "10s")
        answered, reset = srv.answered, srv.reset
    req = accounted(data)
    assert req["sent"] == 20 and req["ok"] == 20, req
    # every request had its own connection, answered whole and then reset mid-upload
    assert answered == reset == 20
    assert data["connections"]["opened"] >= 20


def test_a_reset_at_accept_is_reset_not_connect(tmp_path, engine):
    with Misbehaving("reset_all") as srv:
        data = bench(tmp_path, srv.url, engine, "--rate", "200", "--duration", "1s",
                     "--timeout", "5s")
        accepted, reset = srv.accepted, srv.reset
    req = accounted(data)
    assert req["sent"] == 200 and req["errors"]["reset"] == 200, req
    assert req["errors"]["connect"] == 0 and data["connections"]["connect_failures"] + \
        data["connections"]["opened"] == accepted == reset
