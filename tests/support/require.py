"""Tests that need a real server or tool fail when it is missing: they never skip.

`make test` installs everything the suite needs (apt-get and .venv), so a missing piece is a
broken install step, and a skip would let CI go green without running the test.
"""

from __future__ import annotations

import pytest


def require(reason: str | None) -> None:
    """Fail the calling test with ``reason`` when it is not None."""
    if reason is not None:
        pytest.fail(f"{reason} (make test installs it; a missing install step is a defect)",
                    pytrace=False)
