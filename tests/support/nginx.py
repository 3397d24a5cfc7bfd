"""A real nginx (Debian's ``nginx-light``) on a free loopback port, for tests and benchmarks.

    with Nginx() as ng:                      # one worker, the default locations
        url = ng.url("/")                    # http://127.0.0.1:PORT/
        ng.worker_pids()                     # for SIGSTOP/SIGCONT stalls

Everything (config, pid file, logs, temp dirs) lives in a temporary directory
removed on :meth:`Nginx.stop`. Default locations:

* ``/``      200, body ``hello\\n``
* ``/404``   404, ``/500`` 500
* ``/tcp``   200, body ``pong\\n`` (a fixed response for tcp:// tests)

Pass ``locations`` (nginx ``location`` blocks) to serve something else.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

DEFAULT_LOCATIONS = """
    location = /    { return 200 "hello\\n"; }
    location = /404 { return 404 "nope\\n"; }
    location = /500 { return 500 "boom\\n"; }
    location = /tcp { return 200 "pong\\n"; }
"""

CONFIG = """
worker_processes {workers};
worker_rlimit_nofile 16384;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
daemon off;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    default_type text/plain;
    server {{
        listen {address}:{port}{listen_options} backlog=4096;
        {locations}
    }}
}}
"""


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> str | None:
    """None when nginx can run here, else the reason (for a skip message)."""
    if not os.path.exists(NGINX):
        return f"nginx not installed ({NGINX}); `make test` installs nginx-light"
    return None


class Nginx:
    """Start/stop one nginx master with ``workers`` worker processes."""

    def __init__(self, locations: str = DEFAULT_LOCATIONS, workers: int = 1,
                 port: int | None = None, address: str = "127.0.0.1",
                 netns: str | None = None, listen_options: str = "") -> None:
        """``netns``: run inside that network namespace, listening on ``address`` there.
        ``listen_options``: added to the ``listen`` directive (``ssl`` for a TLS server,
        whose certificate directives go in ``locations``)."""
        self.address, self.netns = address, netns
        self.locations = locations
        self.listen_options = f" {listen_options}" if listen_options else ""
        self.workers = workers
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tailgate-nginx-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return self.address

    def url(self, path: str = "/") -> str:
        return f"http://{self.address}:{self.port}{path}"

    def start(self, timeout_s: float = 10.0) -> Nginx:
        conf = self.dir / "nginx.conf"
        conf.write_text(CONFIG.format(workers=self.workers, dir=self.dir, port=self.port,
                                      address=self.address, locations=self.locations,
                                      listen_options=self.listen_options))
        netns = ["ip", "netns", "exec", self.netns] if self.netns else []  # execs nginx
        self.proc = subprocess.Popen(
            [*netns, NGINX, "-p", str(self.dir), "-e", str(self.dir / "error.log"), "-c", str(conf)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited with {self.proc.returncode}: {err.strip()}")
            if len(self.worker_pids()) >= self.workers and self._accepts():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nginx did not accept on port {self.port} within {timeout_s}s")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.address, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def worker_pids(self) -> list[int]:
        """PIDs of the worker processes (children of the master)."""
        if self.proc is None:
            return []
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            return [int(p) for p in path.read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """Kill master and workers at once (SIGKILL): a server dying mid-run."""
        if self.proc is None:
            return
        for pid in self.worker_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop nginx (workers continued first, so a stopped worker cannot hang it)."""
        if self.proc is not None and self.proc.poll() is None:
            for pid in self.worker_pids():
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
