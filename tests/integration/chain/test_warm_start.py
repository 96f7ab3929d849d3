"""The server opens the lake at start, so the first subscriber does not pay for it.

Opening the lake reader (importing deltalake, loading the Delta log) made the
first subscribe after a start take 0.7-2.6 s; measured by hand, with the
lake opened at start it took 0.02 s (see the report of issue 21).
"""

from __future__ import annotations

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.appkeys import HISTORY
from tests.support.poll import until

from .conftest import STREAM, write_lake


async def test_the_lake_is_opened_at_start_before_any_call(
    settings, serve, connect, redis_client
) -> None:
    gen = SyntheticChain(seed=251)
    write_lake(settings.lake.uri, gen.take(20))
    write_blocks(redis_client, STREAM, gen.take(5))
    async with serve(settings) as (base, app):
        history = app[HISTORY]
        await until(lambda: history.opened == 1, "the lake reader opened with no call")
        async with connect(base) as client:
            await client.subscribe(3, gen.canonical[3].hash)
            assert await client.blocks(22) == gen.canonical[3:25]
        assert history.opened == 1  # the subscriber used the reader opened at start
