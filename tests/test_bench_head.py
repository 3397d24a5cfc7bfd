"""HEAD requests: a response with Content-Length but no body completes on its headers."""

from __future__ import annotations

import json
import subprocess
import sys

from support.nginx import Nginx


def test_head_requests_complete_without_waiting_for_a_body():
    nginx = Nginx().start()
    try:
        proc = subprocess.run([sys.executable, "-m", "tailgate", "bench", nginx.url("/"), "-X", "HEAD",
                               "--rate", "200", "--duration", "2s", "--workers", "1", "--timeout", "1s",
                               "--quiet", "--json", "-"], capture_output=True, text=True, timeout=60,
                              check=False)
    finally:
        nginx.kill()
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["requests"]["sent"] == 400
    assert res["requests"]["ok"] == 400, res["requests"]  # none timed out waiting for a body
