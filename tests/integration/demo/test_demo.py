"""The demo's data and arguments (the full ``sluice demo`` run is ``make demo``)."""

from __future__ import annotations

import pytest
import redis

from pipeline import keys
from pipeline.chain.batch import ENTRY_FIELD, decode_block
from pipeline.demo import INTERVAL_MS, UNARCHIVED, Interval, main, write_chain


def test_interval_is_a_closed_five_minute_window_in_the_past() -> None:
    now = 1_795_650_123_456
    interval = Interval.past(now)
    assert interval.end_ms - interval.start_ms == INTERVAL_MS
    assert interval.end_ms % INTERVAL_MS == 0
    assert now - interval.end_ms >= 2 * 3600 * 1000


def test_chain_lands_inside_the_interval_with_a_reorg_and_a_tail_after_it(
    redis_client: redis.Redis,
) -> None:
    interval = Interval(1_000_000_000_000, 1_000_000_300_000)
    written = write_chain(redis_client, "chain:demo", interval, 40)
    entries = redis_client.xrange(keys.stream("chain:demo"))
    assert len(entries) == written.total
    ms = [int(entry_id.split(b"-")[0]) for entry_id, _ in entries]
    inside = [m for m in ms if interval.start_ms <= m < interval.end_ms]
    assert len(inside) == len(written.inside) >= 40
    assert len(ms) - len(inside) >= UNARCHIVED and min(ms) >= interval.start_ms
    blocks = [decode_block(fields[ENTRY_FIELD]) for _, fields in entries[: len(inside)]]
    assert blocks == written.inside
    canonical = {b.hash for b in written.canonical}
    assert written.reorgs >= 1 and any(b.hash not in canonical for b in written.inside)


def test_bad_block_count_is_refused() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--blocks", "0"])
    assert info.value.code == 2
