"""The check's yardsticks: the heaviest chain of lake + Redis blocks, a subscriber's chain."""

from __future__ import annotations

import pytest

from pipeline.blockcodec import Block
from pipeline.chain.client.ordered import Added, Removed
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.demo.verify import Follower, Known, canonical_chain
from pipeline.errors import BrokenChain


def _known(b: Block) -> Known:
    return Known(num=b.num, hash=b.hash, parent=b.parent, weight=b.weight)


def _written(steps: int) -> tuple[list[Block], SyntheticChain]:
    chain = SyntheticChain(seed=3, reorg_every=5, reorg_depth=3)
    return chain.take(steps), chain


def test_canonical_chain_of_everything_written_is_the_generators_chain() -> None:
    written, chain = _written(60)
    assert chain.reorgs >= 3
    expected = canonical_chain(_known(b) for b in written)
    assert [(k.num, k.hash) for k in expected] == [(b.num, b.hash) for b in chain.canonical]


def test_lake_part_and_redis_part_together_give_the_same_chain() -> None:
    written, chain = _written(60)
    # the lake keeps only canonical blocks of the old part; Redis the rest, reorged ones too
    canonical = {b.hash for b in chain.canonical}
    lake = [b for b in written[:30] if b.hash in canonical]
    expected = canonical_chain([*map(_known, lake), *map(_known, written[30:])])
    assert [k.hash for k in expected] == [b.hash for b in chain.canonical]


def test_a_missing_parent_is_a_broken_chain() -> None:
    written, _ = _written(20)
    with pytest.raises(BrokenChain):
        canonical_chain(_known(b) for b in written if b.num != 7)


def test_follower_accepts_reorgs_as_tip_removals_and_matches() -> None:
    written, chain = _written(40)
    follower = Follower()
    tip: list[Block] = []
    for b in written:  # what a subscriber sees: removals back to the fork point, then adds
        while tip and tip[-1].num >= b.num:
            gone = tip.pop()
            follower.apply(Removed(num=gone.num, hash=gone.hash))
        tip.append(b)
        follower.apply(Added(block=b))
    expected = canonical_chain(_known(b) for b in written)
    assert follower.compare(expected) == []
    assert follower.removed > 0


def test_follower_reports_a_duplicate_and_a_gap() -> None:
    written, _ = _written(10)
    follower = Follower()
    follower.apply(Added(block=written[0]))
    follower.apply(Added(block=written[0]))  # the same block twice
    follower.apply(Added(block=written[2]))  # block 1 skipped
    assert follower.problem_count == 2
    assert follower.compare(canonical_chain(_known(b) for b in written[:3]))
