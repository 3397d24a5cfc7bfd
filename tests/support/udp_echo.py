"""The suite's UDP echo server (udp_echo.c) in a network namespace of its own, reached over a
veth pair, both made for the test and removed after (names carry ``46``, the issue's number,
so they cannot collide with another test's).

    exe = build_echo(tmp_dir)
    with EchoNs(exe, "drop=10") as e:    # e.url: udp://10.146.0.2:PORT
        ...
    e.report  # the server's last line: "received R echoed E"
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

SRC = Path(__file__).parent / "udp_echo.c"


def build_echo(where: Path) -> Path:
    exe = where / "udp_echo"
    if not exe.exists():
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(SRC)], check=True)
    return exe


class EchoNs:
    """A namespace ``tg46-*`` joined by veth ``tg46h*``/``tg46n*`` (10.SUBNET.0.1 here,
    10.SUBNET.0.2 there), the echo server running inside it."""

    def __init__(self, exe: Path, *options: str, seconds: int = 120, subnet: int = 146) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns, self.host, self.peer = f"tg46-{tag}", f"tg46h{tag}", f"tg46n{tag}"
        self.host_ip, self.ns_ip = f"10.{subnet}.0.1", f"10.{subnet}.0.2"
        self.cmd = ["ip", "netns", "exec", self.ns, str(exe), self.ns_ip, "0", str(seconds),
                    *options]
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.report = ""

    @property
    def url(self) -> str:
        return f"udp://{self.ns_ip}:{self.port}"

    def __enter__(self) -> EchoNs:
        cmds = [["ip", "netns", "add", self.ns],
                ["ip", "link", "add", self.host, "type", "veth", "peer", "name", self.peer],
                ["ip", "link", "set", self.peer, "netns", self.ns],
                ["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host],
                ["ip", "link", "set", self.host, "up"],
                ["ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/24", "dev", self.peer],
                ["ip", "-n", self.ns, "link", "set", self.peer, "up"],
                ["ip", "-n", self.ns, "link", "set", "lo", "up"]]
        try:
            for c in cmds:
                subprocess.run(c, check=True, capture_output=True)
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
            if not line.startswith("ready "):
                raise RuntimeError(f"udp_echo did not start: {line!r}")
            self.port = int(line.split()[1])
        except BaseException:
            self.__exit__()
            raise
        return self

    def stop(self) -> str:
        """End the server; its report line ("received R echoed E")."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                out, _ = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate()
            self.report = out.strip().splitlines()[-1] if out.strip() else ""
        return self.report

    def __exit__(self, *exc: object) -> None:
        self.stop()
        subprocess.run(["ip", "link", "del", self.host], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], check=False, capture_output=True)
