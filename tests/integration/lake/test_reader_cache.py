"""The reader's per-file cache (used by ``sluice serve``) against tables written by delta-rs."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.lake.storage.reader import LakeReader
from pipeline.lake.write.jobs import ensure_tables
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import append_blocks, chain


def _nums(reader: LakeReader, stream: str, start: int, stop: int | None, rows: int) -> list[Any]:
    return [
        n
        for t in reader.iter_canonical_arrow(stream, start, stop, batch_rows=rows)
        for n in t.column("num").to_pylist()
    ]


def test_cached_reads_equal_uncached_reads(lake_uri: str) -> None:
    main = chain(0, 60)
    # Files out of order, overlapping ranges, rows unsorted inside a file, reorged rows,
    # and another stream in the same files.
    append_blocks(lake_uri, "s", main[30:60][::-1] + main[5:10])
    append_blocks(lake_uri, "s", main[0:5] + main[10:30])
    append_blocks(lake_uri, "s", chain(20, 25, branch="fork"), canonical=False)
    append_blocks(lake_uri, "other", chain(0, 40, branch="o"))
    cached = LakeReader(lake_uri, cache_bytes=1 << 24)
    plain = LakeReader(lake_uri)
    for start, stop, rows in [(0, None, 7), (33, 34, 1), (10, 50, 4), (59, None, 3), (60, None, 5)]:
        for _ in range(2):  # cold, then from the cache
            assert _nums(cached, "s", start, stop, rows) == _nums(plain, "s", start, stop, rows)
    assert _nums(cached, "s", 0, None, 8) == list(range(60))
    assert _nums(cached, "other", 5, 9, 8) == [5, 6, 7, 8]
    hashes = [
        h for t in cached.iter_canonical_arrow("s", 18, 27) for h in t.column("hash").to_pylist()
    ]
    assert hashes == [b.hash.hex() for b in main[18:27]]
    assert 0 < cached._cache.size <= cached._cache.limit

    # A file added later is read at the next refresh; cached files stay valid.
    append_blocks(lake_uri, "s", chain(60, 70))
    assert _nums(cached, "s", 55, None, 8) == list(range(55, 60))
    cached.refresh()
    assert _nums(cached, "s", 55, None, 8) == list(range(55, 70))


def test_cache_stays_within_its_bound(lake_uri: str) -> None:
    for lo in range(0, 40, 10):
        append_blocks(lake_uri, "s", chain(lo, lo + 10))
    one_file = LakeReader(lake_uri, cache_bytes=1 << 24)
    assert _nums(one_file, "s", 0, 10, 100) == list(range(10))
    limit = one_file._cache.size * 2 + 1  # room for two files, not four
    small = LakeReader(lake_uri, cache_bytes=limit)
    assert _nums(small, "s", 0, None, 100) == list(range(40))
    assert 0 < small._cache.size <= limit
    tiny = LakeReader(lake_uri, cache_bytes=1)  # nothing fits: reads still work
    assert _nums(tiny, "s", 5, 25, 3) == list(range(5, 25))
    assert tiny._cache.size == 0


def test_negative_cache_is_refused(lake_uri: str) -> None:
    with pytest.raises(ValueError, match="cache_bytes"):
        LakeReader(lake_uri, cache_bytes=-1)


@pytest.mark.parametrize("cache_bytes", [0, 1 << 24])
def test_range_read_opens_files_in_num_order_on_a_partitioned_table(
    lake_uri: str, cache_bytes: int
) -> None:
    # As the jobs create it: partitioned by stream. A chain stream's name holds characters
    # escaped in the partition directory and escaped again in the Delta log's paths.
    ensure_tables(LakeSettings.from_url(lake_uri))
    stream = "chain:a b%c"
    for lo in range(0, 200, 20):
        append_blocks(lake_uri, stream, chain(lo, lo + 20))
    append_blocks(lake_uri, "other", chain(0, 50, branch="o"))
    reader = LakeReader(lake_uri, cache_bytes=cache_bytes)
    pages = reader.iter_canonical_arrow(stream, 125, batch_rows=5)
    first = next(pages)
    assert first.column("num").to_pylist() == list(range(125, 130))
    # The first page needs only the file holding 125, not every file above it.
    assert reader.statistics().files_read == 1
    rest = [n for t in pages for n in t.column("num").to_pylist()]
    assert rest == list(range(130, 200))
    assert reader.statistics().files_read == 4  # files 120.., 140.., 160.., 180..


def test_range_reads_share_one_dataset_per_version_and_stream(lake_uri: str) -> None:
    ensure_tables(LakeSettings.from_url(lake_uri))
    for lo in range(0, 60, 20):
        append_blocks(lake_uri, "chain:a", chain(lo, lo + 20))
    append_blocks(lake_uri, "other", chain(0, 10, branch="o"))
    reader = LakeReader(lake_uri, cache_bytes=1 << 24)
    for start in (0, 25, 59, 59):
        assert _nums(reader, "chain:a", start, None, 8) == list(range(start, 60))
    assert _nums(reader, "other", 3, 5, 8) == [3, 4]
    assert reader.statistics().datasets == 2  # one for each stream, not one a read
    append_blocks(lake_uri, "chain:a", chain(60, 70))
    assert _nums(reader, "chain:a", 55, None, 8) == list(range(55, 60))  # the old snapshot
    reader.refresh()
    assert _nums(reader, "chain:a", 55, None, 8) == list(range(55, 70))
    assert _nums(reader, "chain:a", 65, 68, 8) == [65, 66, 67]
    assert reader.statistics().datasets == 3
