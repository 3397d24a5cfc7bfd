"""The README's first promise on the machine it is made to: `make run` in a brand-new Debian 12
root (debootstrap minbase plus only git and make, entered with chroot), from a fresh clone.

tests/support/fresh_root.sh builds the root once (cached under /var/cache/tailgate-fresh-root,
with the downloaded packages and wheels; every run starts from the pristine root through an
overlay) and sets it up as a machine would be where a chroot differs: its own mount
namespace, /proc, /sys (tracefs, cgroups) and /dev bound in, /run a tmpfs, an /etc/hosts that
names the host. `make test` in such a root is the same script with `test` (about half an
hour: `make fresh-root-test`, by hand before a release; the README says when it last passed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tailgate.baseline import catalog

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "support" / "fresh_root.sh"

pytestmark = pytest.mark.timeout(1800)


def test_make_run_on_a_fresh_debian_12_root(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("debootstrap and chroot need root; CI runs as root")
    if shutil.which("debootstrap") is None:
        pytest.fail("debootstrap not found: make test installs it (APT_TEST)")
    env = {**os.environ, "FRESH_ROOT_OUT": str(tmp_path)}
    proc = subprocess.run([str(SCRIPT), "run", str(REPO)], capture_output=True, text=True,
                          timeout=1700, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "fresh_root: make run exited 0" in out, out[-4000:]
    assert "fresh_root: compiled engine present" in out, out[-4000:]
    rep = json.loads((tmp_path / "report.json").read_text())
    assert {f["id"] for f in rep["findings"]} == set(catalog())
