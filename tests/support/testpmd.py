"""A real DPDK testpmd (Debian's ``dpdk-dev``) for tests: no hugepages, no NIC, one busy core.

    with Testpmd(["--vdev", "net_null0"], ["--forward-mode=io"]) as pmd:
        pmd.prefix                 # its --file-prefix, unique per run
        pmd.socket                 # /var/run/dpdk/<prefix>/dpdk_telemetry.v2
        pmd.command("show port stats 0")   # interactive mode only: the reply text

The main lcore sleeps on stdin on CPU 0 and the single forwarding lcore busy-polls CPU 1
(``--lcores 0@0,1@1``): one core for the life of the context, which is always ended
(``quit``, then kill) and whose runtime directory is removed. ``netns`` runs it inside a
network namespace the test made, so tap and af_packet/pcap ports live there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

TESTPMD = "dpdk-testpmd"
RUN_DIR = Path("/var/run/dpdk")


class Testpmd:
    __test__ = False  # not a test class, whatever pytest guesses from the name
    def __init__(self, eal: list[str], app: list[str], *, netns: str | None = None,
                 lcores: str = "0@0,1@1", interactive: bool = False, mbufs: int = 8192):
        if shutil.which(TESTPMD) is None:
            raise RuntimeError(f"{TESTPMD} is not installed (Debian package dpdk-dev)")
        self.prefix = f"tg-{uuid.uuid4().hex[:8]}"
        self.socket = str(RUN_DIR / self.prefix / "dpdk_telemetry.v2")
        self.interactive = interactive
        # stdbuf: testpmd's stdout is a file here, and its prompts must not sit in a buffer.
        argv = ["stdbuf", "-oL", TESTPMD, "--lcores", lcores, "--no-huge", "-m", "256", "--no-pci",
                "--file-prefix", self.prefix, *eal, "--",
                *(["-i"] if interactive else []), f"--total-num-mbufs={mbufs}", "--auto-start",
                *app]
        self.argv = ["ip", "netns", "exec", netns, *argv] if netns else argv
        self._out = tempfile.NamedTemporaryFile("w+", prefix="testpmd-", suffix=".log")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Testpmd:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=self._out,
                                     stderr=subprocess.STDOUT, text=True)
        try:
            self._wait_ready(20.0)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def output(self) -> str:
        return Path(self._out.name).read_text(errors="replace")

    def _wait_ready(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        marker = "testpmd>" if self.interactive else "Press enter to exit"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"testpmd exited ({self.proc.returncode}):\n{self.output()[-2000:]}")
            if marker in self.output() and os.path.exists(self.socket):
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                        s.settimeout(1.0)
                        s.connect(self.socket)
                        s.recv(4096)
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"testpmd not ready in {limit_s:g} s:\n{self.output()[-2000:]}")

    def command(self, line: str, marker: str = "testpmd>", timeout_s: float = 5.0) -> str:
        """Send one interactive command and return what it printed up to the next prompt."""
        assert self.interactive and self.proc is not None and self.proc.stdin is not None
        start = len(self.output())
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.output()[start:]
            if marker in text and text.rstrip().endswith("testpmd>"):
                return text
            time.sleep(0.001)
        raise RuntimeError(f"no answer to {line!r} in {timeout_s:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n" if self.interactive else "\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(RUN_DIR / self.prefix, ignore_errors=True)
        self._out.close()


def netns_sh(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True,
                          text=True, timeout=30).stdout
