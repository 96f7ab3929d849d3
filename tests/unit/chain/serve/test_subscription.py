"""The cardinal dialect's reorg rules of a websocket subscription (pipeline/chain/serve/subscription.py).

The library's processor links a reorg by weight only when its ancestor is a
block it finished; after an announce (``HandleReorg``) it holds the ancestor as
its ``lastHash`` only. Integration: tests/integration/chain/test_cardinal_fork_start.py.
"""

from __future__ import annotations

import pytest

from pipeline.chain.cardinal import CARDINAL
from pipeline.chain.outbox import Outbox
from pipeline.chain.planning import Emit
from pipeline.chain.serve.subscription import Subscription, parse_subscribe
from pipeline.errors import ReorgReconnect


def _sub(num: int, *, announce: bool) -> Subscription:
    params = parse_subscribe(["streams", hex(num), "0x" + "ab" * 32, []])
    return Subscription("0x1", params, Outbox(100), dialect=CARDINAL, announce=announce)


def _emit(num: int, parent: str, reorg: int = 0) -> Emit:
    return Emit(num, f"{num:02x}" * 32, parent, ["{}"], reorg)


def test_a_sibling_of_the_first_block_after_an_announce_closes_the_connection() -> None:
    sub = _sub(29, announce=True)
    sub.put_nowait([_emit(29, "28", reorg=1)])  # the ancestor 28 named, then 29
    with pytest.raises(ReorgReconnect):
        sub.put_nowait([_emit(29, "28", reorg=1)])  # a heavier 29': forks at 28


def test_a_reorg_above_the_first_block_after_an_announce_is_left_to_the_library() -> None:
    sub = _sub(29, announce=True)
    sub.put_nowait([_emit(29, "28", reorg=1), _emit(30, "29")])
    sub.put_nowait([_emit(30, "29", reorg=1)])  # forks at 29, a block the library finished


def test_a_reorg_of_the_subscribers_own_block_closes_the_connection() -> None:
    sub = _sub(29, announce=False)  # the library finished its own block 29 only
    sub.put_nowait([_emit(30, "29")])
    sub.put_nowait([_emit(30, "29", reorg=1)])  # forks at 29: fine
    with pytest.raises(ReorgReconnect):
        sub.put_nowait([_emit(29, "28", reorg=2)])  # forks at 28: below it
