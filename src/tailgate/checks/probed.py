"""Checks judged from eBPF probe evidence (tailgate probe / inspect --probe-window)."""

from __future__ import annotations
