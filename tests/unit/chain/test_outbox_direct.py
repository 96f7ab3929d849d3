"""Outbox: bounded, refuses what does not fit."""

from __future__ import annotations

from pipeline.chain.subscription import Outbox


def test_full_outbox_still_refuses() -> None:
    box = Outbox(2)
    assert box.offer(["a", "b"])
    assert not box.offer(["c"]) and len(box) == 2
