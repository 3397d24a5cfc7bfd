"""Checks of layer 1. See SPEC.md; each function is registered under its id."""

from __future__ import annotations
