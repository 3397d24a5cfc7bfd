"""Headless Chromium (Debian `chromium`) for testing HTML reports as a browser sees them.

The page is opened from a file URL with every network request sent to a dead proxy, so a
page that needed the network shows a console error. Console messages come from Chromium's own
log; the DOM is read after scripts ran (virtual time), and a screenshot is written for a
person to look at (under build/screenshots/ in the repository, or $TAILGATE_SCREENSHOTS).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]
CONSOLE = re.compile(r":(INFO|WARNING|ERROR):CONSOLE[^\]]*\] (.*)$")


@dataclass
class Rendered:
    dom: str
    console: list[str]
    screenshot: Path


def chromium() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium not installed (Debian `chromium`; make test installs it)")
    return exe


def screenshot_dir() -> Path:
    d = Path(os.environ.get("TAILGATE_SCREENSHOTS", REPO / "build" / "screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def render(page: Path, name: str, budget_ms: int = 10000, size: str = "1200,1800") -> Rendered:
    exe = chromium()
    url = page.resolve().as_uri()
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}/a", "--enable-logging=stderr",
                              "--v=0", f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120, check=True)
        shot = screenshot_dir() / f"{name}.png"
        subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}/b",
                        f"--virtual-time-budget={budget_ms}", f"--window-size={size}",
                        f"--screenshot={shot}", url],
                       capture_output=True, text=True, timeout=120, check=True)
    console = [m.group(2) for line in dom.stderr.splitlines() if (m := CONSOLE.search(line))]
    return Rendered(dom.stdout, console, shot)
