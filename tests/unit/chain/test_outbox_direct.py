"""Outbox.direct: the live hot path writes at once, but never overtakes queued texts."""

from __future__ import annotations

from pipeline.chain.subscription import Outbox


def test_direct_write_only_when_nothing_is_queued() -> None:
    written: list[list[str]] = []
    accept = True

    def direct(texts: list[str]) -> bool:
        if accept:
            written.append(texts)
        return accept

    box = Outbox(4, direct=direct)
    assert box.offer(["a", "b"])
    assert written == [["a", "b"]] and len(box) == 0
    accept = False  # e.g. the transport is paused: queue instead
    assert box.offer(["c"])
    assert len(box) == 1
    accept = True
    assert box.offer(["d"])  # "c" is queued: "d" must wait behind it
    assert written == [["a", "b"]]
    assert box.pop_many(10) == ["c", "d"]
    assert box.offer(["e"]) and written[-1] == ["e"]


def test_full_outbox_still_refuses() -> None:
    box = Outbox(2, direct=lambda texts: False)
    assert box.offer(["a", "b"])
    assert not box.offer(["c"]) and len(box) == 2
