"""A real two-node Ray cluster for tests: the head in the host namespace, a worker node
in a network namespace the test made (joined by veth), so each node has its own address.

    with RayCluster() as rc:     # head on rc.veth.host_ip, node 2 on rc.veth.ns_ip
        rc.address               # "10.S.0.1:PORT" for --ray
        rc.kill_node_raylet()    # SIGKILL the namespace node's raylet (a lost node)

Each node gets one CPU. Ray's health check is made fast (0.5 s x 3) so that a
killed node is declared dead within seconds. The cluster is always stopped with
`ray stop --force` (Ray's own way; it stops every Ray process on the machine) and
the namespace removed, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .netloss import Veth
from .nginx import free_port

VENV_BIN = Path(sys.executable).parent
RAY = shutil.which("ray", path=str(VENV_BIN)) or shutil.which("ray")
SRC = str(Path(__file__).resolve().parents[2] / "src")
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
               "RAY_health_check_initial_delay_ms": "500", "RAY_health_check_timeout_ms": "500"}


def available() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed: pip install 'tailgate[ray]'"
    if RAY is None:
        return "the `ray` command is not on PATH"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = SRC + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["PATH"] = f"{VENV_BIN}{os.pathsep}{e.get('PATH', '')}"
    e["RAY_USAGE_STATS_ENABLED"] = "0"
    e.update(FAST_HEALTH)
    return e


class RayCluster:
    def __init__(self, subnet: int = 213, port: int | None = None) -> None:
        self.veth = Veth(subnet)
        self.port = port or free_port()  # the head's GCS port
        self.address = f"{self.veth.host_ip}:{self.port}"

    def _run(self, cmd: list[str], timeout: float = 90) -> None:
        r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout)[-1500:]}")

    def __enter__(self) -> RayCluster:
        self.veth.__enter__()
        try:
            self._run([RAY, "start", "--head", "--node-ip-address", self.veth.host_ip,
                       "--port", str(self.port), "--num-cpus", "1",
                       "--include-dashboard=false", "--disable-usage-stats"])
            self._run(["ip", "netns", "exec", self.veth.ns, RAY, "start", "--address",
                       self.address, "--node-ip-address", self.veth.ns_ip, "--num-cpus", "1",
                       "--disable-usage-stats"])
            self.wait_nodes(2)
        except BaseException:
            self.__exit__()
            raise
        return self

    def alive(self) -> int:
        code = (f"import ray; ray.init(address={self.address!r}, logging_level='ERROR', "
                "log_to_driver=False); print(sum(1 for n in ray.nodes() if n['Alive']))")
        r = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True,
                           text=True, timeout=60)
        return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else -1

    def wait_nodes(self, n: int, within_s: float = 40.0) -> None:
        deadline = time.monotonic() + within_s
        seen = -1
        while time.monotonic() < deadline:
            seen = self.alive()
            if seen == n:
                return
            time.sleep(1.0)
        raise RuntimeError(f"{n} Ray nodes expected alive, saw {seen}")

    def ns_pids(self, name: str) -> list[int]:
        """Processes called ``name`` inside the worker node's namespace."""
        want = os.stat(f"/run/netns/{self.veth.ns}").st_ino
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                comm = Path(f"/proc/{d}/comm").read_text().strip()
                if comm == name and os.stat(f"/proc/{d}/ns/net").st_ino == want:
                    out.append(int(d))
            except OSError:
                continue
        return out

    def kill_node_raylet(self) -> list[int]:
        pids = self.ns_pids("raylet")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    def __exit__(self, *exc: object) -> None:
        try:
            subprocess.run([RAY, "stop", "--force"], env=env(), capture_output=True,
                           timeout=60, check=False)
        finally:
            self.veth.__exit__()
