"""process facts."""

from __future__ import annotations
