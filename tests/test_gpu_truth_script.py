"""tests/device/gpu_truth.sh, the real-GPU check: its shell and its embedded Python are
valid, and on a host where it cannot run it says why and exits 2 (decided from what this
host is: no NVIDIA GPU here, or, on a GPU host, no wheels at the given path). It has not run
on a real GPU: no device machine was lent to the session that wrote it."""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parent / "device" / "gpu_truth.sh"


def test_shell_and_embedded_python_parse():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], timeout=30).returncode == 0
    blocks = re.findall(r"<<'EOF'\n(.*?)\nEOF\n", SCRIPT.read_text(), re.S)
    assert len(blocks) == 2  # the allocator workload and the checks
    for i, code in enumerate(blocks):
        compile(code, f"{SCRIPT}:block{i}", "exec")


def test_refuses_with_the_reason_where_it_cannot_run(tmp_path):
    nvidia = [d for d in glob.glob("/sys/bus/pci/devices/*")
              if Path(d, "vendor").read_text().strip() == "0x10de"]
    proc = subprocess.run([str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "WHEELS": str(tmp_path / "none")})
    assert proc.returncode == 2, proc.stderr
    if not nvidia or shutil.which("nvidia-smi") is None:
        assert "no NVIDIA GPU here" in proc.stderr
    else:
        assert "no wheels at" in proc.stderr
