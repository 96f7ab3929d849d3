"""Per-peer reachability and the spacing of probes to a peer that answers nothing
(issue 31, item 4: a dead peer got ~87 connection attempts a second)."""

from __future__ import annotations

import pytest

from pipeline.bus.outbound import Outcome
from pipeline.bus.peers import PeerBook

UNREACHABLE = (Outcome.UNREACHABLE, "no answer: ConnectionRefusedError")
DELIVERED = (Outcome.DELIVERED, "")


class Clocks:
    def __init__(self) -> None:
        self.now = 1000.0
        self.jitter = 1.0

    def book(self, base_s: float = 0.1, cap_s: float = 2.0) -> PeerBook:
        return PeerBook(
            base_s=base_s,
            cap_s=cap_s,
            clock=lambda: self.now,
            monotonic=lambda: self.now,
            jitter=lambda: self.jitter,
        )


def test_probes_to_a_dead_peer_double_up_to_the_cap() -> None:
    clocks = Clocks()
    book = clocks.book()
    assert book.wait_s(7) is None  # an unknown peer is not held back
    assert book.noted(7, [UNREACHABLE] * 3) == ("down", 0.0)
    waits = []
    for _ in range(7):
        wait = book.wait_s(7)
        assert wait is not None
        waits.append(round(wait, 3))
        clocks.now += wait  # the probe goes when due, and fails
        assert book.noted(7, [UNREACHABLE]) is None
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_the_jitter_takes_off_up_to_half() -> None:
    clocks = Clocks()
    book = clocks.book()
    clocks.jitter = 0.0
    assert book.probe_delay(10) == pytest.approx(1.0)
    clocks.jitter = 0.5
    assert book.probe_delay(10) == pytest.approx(1.5)
    assert book.probe_delay(0) == pytest.approx(0.075)


def test_posts_that_left_before_the_peer_was_known_down_are_no_probes() -> None:
    clocks = Clocks()
    book = clocks.book()
    book.noted(7, [UNREACHABLE])
    for _ in range(20):  # the other POSTs in flight fail at the same moment
        book.noted(7, [UNREACHABLE])
    assert book.wait_s(7) == pytest.approx(0.1)  # not 2.0: no probe went yet


def test_an_answer_ends_it_and_says_for_how_long() -> None:
    clocks = Clocks()
    book = clocks.book()
    book.noted(7, [UNREACHABLE])
    clocks.now += 30
    assert book.unreachable() == {7: 30.0}
    assert book.noted(7, [DELIVERED, UNREACHABLE]) == ("up", 30.0)
    assert book.wait_s(7) is None and book.unreachable() == {}
    assert book.noted(7, [DELIVERED]) is None


def test_a_post_that_carried_nothing_says_nothing_of_the_peer() -> None:
    clocks = Clocks()
    book = clocks.book()
    book.noted(7, [UNREACHABLE])
    assert book.noted(7, []) is None  # every item expired, or no such twin: nothing sent
    assert book.wait_s(7) is not None  # still down
    assert book.noted(7, [(Outcome.REFUSED, "remote refused: replayed request")]) == ("up", 0.0)


def test_a_peer_silent_for_a_minute_no_longer_counts_as_unreachable() -> None:
    clocks = Clocks()
    book = clocks.book()
    book.noted(7, [UNREACHABLE])
    clocks.now += 61
    assert book.unreachable() == {}
    book.noted(7, [UNREACHABLE])
    assert book.unreachable() == {7: 61.0}
