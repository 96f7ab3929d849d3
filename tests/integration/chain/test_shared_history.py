"""The server's shared lake reader: a reader behind the lake never causes a gap or a rewind."""

from __future__ import annotations

import redis

from pipeline import keys
from pipeline.chain.history.lakeview import SharedHistory
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.lake.storage.reader import LakeReader

from .conftest import STREAM, write_lake


async def test_stale_shared_reader_is_refreshed_instead_of_rewinding(
    settings, serve, connect, redis_client: redis.Redis
) -> None:
    canon = SyntheticChain(seed=21).take(40)
    write_lake(settings.lake.uri, canon[:10])
    write_blocks(redis_client, STREAM, canon[10:])
    ids = [entry_id for entry_id, _ in redis_client.xrange(keys.stream(STREAM))]
    # A reader that would never refresh on its own within the test.
    shared = SharedHistory(
        lambda: LakeReader(settings.lake.uri, cache_bytes=1 << 24), check_every_s=3600
    )
    async with serve(settings, history_factory=shared) as (base, _app):
        async with connect(base) as client:
            await client.subscribe(3, canon[3].hash)
            assert await client.blocks(37) == canon[3:40]
        reader = shared()
        assert shared.opened == 1 and reader is not None and reader.version == 0
        # Archive 10..29, then trim them from Redis: the shared reader has not seen them yet.
        write_lake(settings.lake.uri, canon[10:30])
        key = keys.stream(STREAM)
        redis_client.xtrim(key, minid=ids[20], approximate=False)
        assert len(redis_client.xrange(key)) == 10
        async with connect(base) as client:
            await client.subscribe(15, canon[15].hash)  # in the part the reader missed
            assert await client.blocks(25) == canon[15:40]  # from 15 exactly: not a rewind
        async with connect(base) as client:
            await client.subscribe(5, canon[5].hash)  # crosses the old end of the lake
            assert await client.blocks(35) == canon[5:40]
    assert shared.opened == 1 and shared() is reader and reader.version == 1


def test_idle_cached_files_are_dropped_and_used_ones_kept(lake_uri: str) -> None:
    """``drop_idle(s)`` drops the cached lake files unused for ``s`` seconds (the least
    recently used first), keeps the others, and reads stay correct afterwards."""
    gen = SyntheticChain(seed=5)
    for _ in range(3):
        write_lake(lake_uri, gen.take(50))
    history = SharedHistory(lambda: LakeReader(lake_uri, cache_bytes=1 << 26))
    assert history.drop_idle(0) == 0  # nothing read, nothing cached
    reader = history()
    assert isinstance(reader, LakeReader)

    def nums(start: int, stop: int | None = None) -> list[int]:
        return [n for t in reader.iter_canonical_arrow(STREAM, start, stop)
                for n in t.column("num").to_pylist()]  # fmt: skip

    assert nums(0) == list(range(150))
    assert history.drop_idle(3600) == 0  # all used just now
    assert history.drop_idle(0) == 3
    assert history.drop_idle(0) == 0
    assert nums(60, 70) == list(range(60, 70))  # read again, one file cached again
    assert history.drop_idle(0) == 1
