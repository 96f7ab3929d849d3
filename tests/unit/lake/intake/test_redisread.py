from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.lake.intake.redisread import MAX_SEQ, format_id, id_before, parse_id, split_range


def test_parse_and_format_ids() -> None:
    assert parse_id("5-3") == (5, 3)
    assert parse_id(b"12") == (12, 0)
    assert format_id((7, 0)) == "7-0"
    for bad in ("", "-", "a-1", "1-b", "1-2-3", "-1", str(MAX_SEQ + 1)):
        with pytest.raises(ValueError):
            parse_id(bad)


def test_id_before() -> None:
    assert id_before((5, 3)) == (5, 2)
    assert id_before((5, 0)) == (4, MAX_SEQ)
    assert id_before((0, 0)) is None


def test_split_range_edges() -> None:
    assert split_range((5, 0), (4, 0), 3) == []
    assert split_range((5, 2), (5, 9), 4) == [((5, 2), (5, 9))]
    assert split_range((0, 0), (9, 0), 2) == [((0, 0), (4, MAX_SEQ)), ((5, 0), (9, 0))]
    with pytest.raises(ValueError):
        split_range((0, 0), (1, 0), 0)


ids = st.tuples(st.integers(0, 10**6), st.integers(0, 5))


@given(ids, ids, st.integers(1, 20))
def test_split_range_covers_exactly(a: tuple[int, int], b: tuple[int, int], parts: int) -> None:
    first, last = min(a, b), max(a, b)
    ranges = split_range(first, last, parts)
    assert 1 <= len(ranges) <= parts
    assert ranges[0][0] == first and ranges[-1][1] == last
    for lo, hi in ranges:
        assert lo <= hi
    for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False):
        assert id_before(lo) == hi  # contiguous, no overlap


def test_split_occupied_gives_each_range_as_many_busy_slices() -> None:
    """A burst at the end of a span (what a split by milliseconds gives one range): two
    ranges of two busy slices each; with every slice busy, the plain split."""
    from pipeline.lake.intake.redisread import split_occupied

    edges = list(range(0, 110, 10))  # ten slices of 10 ms
    busy = [True] + [False] * 6 + [True] * 3
    ranges = split_occupied((0, 0), (99, 7), edges, busy, 2)
    assert ranges == [((0, 0), (79, MAX_SEQ)), ((80, 0), (99, 7))]
    assert split_occupied((0, 0), (99, 7), edges, [True] * 10, 2) == split_range((0, 0), (99, 7), 2)
    assert split_occupied((0, 0), (99, 7), edges, busy, 9) == [
        ((0, 0), (69, MAX_SEQ)), ((70, 0), (79, MAX_SEQ)), ((80, 0), (89, MAX_SEQ)),
        ((90, 0), (99, 7)),
    ]  # fmt: skip


def test_ranges_for_gives_a_small_interval_one_range_and_a_busy_one_up_to_parts(
    redis_url: str,
) -> None:
    """One Spark task per ``per_range`` expected entries, at most ``parts`` (a real Redis)."""
    from pipeline.lake.intake.redisread import connect, ranges_for

    per = 4096

    client = connect(redis_url)
    try:
        pipe = client.pipeline(transaction=False)
        for ms in range(10_000):  # one entry a millisecond: 10,000 in [0, 9999]
            pipe.xadd("s", {"f": "v"}, id=f"{ms + 1}-0")
        pipe.execute()
        assert ranges_for(client, "s", (1, 0), (600, 0), 4, per) == 1  # 600 expected
        assert ranges_for(client, "s", (1, 0), (per + 1, 0), 4, per) == 2
        assert ranges_for(client, "s", (1, 0), (10_000, 0), 4, per) == 3  # 10,000 expected
        assert ranges_for(client, "s", (1, 0), (10_000, 0), 2, per) == 2  # never more than parts
        assert ranges_for(client, "s", (1, 0), (10_000, 0), 1, per) == 1
        assert ranges_for(client, "absent", (1, 0), (10_000, 0), 4, per) == 1
        assert ranges_for(client, "s", (1, 0), (600, 0), 4, 1) == 4  # 1: as many as allowed
    finally:
        client.close()
