"""l2.io.io_uring on real rings: a C program holds a ring open, inspect --pid judges it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.inspect import inspect_ready_process

SRC = Path(__file__).parent / "support" / "uring_ring.c"


@pytest.fixture(scope="module")
def uring_ring(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("uring") / "uring_ring"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(SRC), "-luring"], check=True)
    return exe


@pytest.mark.parametrize("mode,status,words", [
    ("sqpoll", "pass", "SQPOLL and registered buffers"),
    ("plain", "warn", "without SQPOLL"),
    ("none", "skip", "no io_uring ring (epoll or plain syscalls)"),
])
def test_io_uring_rings_judged_from_fdinfo(uring_ring, mode, status, words):
    f = inspect_ready_process([str(uring_ring), mode, "20"], "l2.io.io_uring")
    assert f["status"] == status and words in f["reason"], f
    if mode != "none":
        (ring,) = f["evidence"]["rings"]
        assert ring["user_bufs"] == 2 and ring["sqpoll"] is (mode == "sqpoll")
