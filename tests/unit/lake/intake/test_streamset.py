"""A run's streams cut into the ``archive`` tasks' shards (pipeline/lake/intake/streamset.py)."""

from __future__ import annotations

import pytest

from pipeline.lake.intake.streamset import shards


def test_shards_keep_the_order_and_hold_at_most_their_size() -> None:
    names = [f"ev:{i}" for i in range(1000)]
    cut = shards(names, 100)
    assert len(cut) == 10 and all(len(shard) == 100 for shard in cut)
    assert [name for shard in cut for name in shard] == names
    assert shards(names[:250], 100)[-1] == names[200:250]
    assert shards(["chain:a"], 100) == [["chain:a"]]
    assert shards([], 100) == []


def test_a_shard_holds_at_least_one_stream() -> None:
    with pytest.raises(ValueError, match="at least one stream"):
        shards(["a"], 0)
