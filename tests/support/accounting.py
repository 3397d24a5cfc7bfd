"""Assertions every bench result must satisfy, shared by the protocol test modules."""

from __future__ import annotations


def accounted(data: dict) -> dict:
    """Every request sent got one outcome, counted by independent counters; returns the
    ``requests`` block."""
    req = data["requests"]
    assert req["sent"] == req["ok"] + sum(req["errors"].values())
    assert req["sent"] == req["scheduled"]
    assert data["latency_ms"]["count"] == req["sent"]
    assert req["abandoned"] == 0
    assert data["accounting"] == {"consistent": True, "problems": []}
    return req


def only_error(req: dict, every_request: bool = False) -> tuple[str, str]:
    """The one error kind of a run, and its one example reason (``every_request``: every
    request sent ended with it)."""
    kinds = [k for k, v in req["errors"].items() if v]
    assert len(kinds) == 1, req
    kind = kinds[0]
    assert len(req["error_examples"][kind]) == 1, req
    (example,) = req["error_examples"][kind]
    assert example["count"] == req["errors"][kind]
    if every_request:
        assert req["errors"][kind] == req["sent"], req
    return kind, example["reason"]
