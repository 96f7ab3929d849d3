"""Both websocket frame writers of pipeline.chain.aiohttp_adapter serve a subscription end to end."""

from __future__ import annotations

import pytest
import redis

from pipeline.chain.aiohttp_adapter import PublicWriter, RawWriter
from pipeline.chain.generator import SyntheticChain, write_blocks
from pipeline.chain.server import CONNECTIONS

from .conftest import STREAM, write_lake


@pytest.mark.parametrize(("public", "writer"), [("", RawWriter), ("1", PublicWriter)])
async def test_lake_tail_and_live_in_order_through_either_writer(
    settings, serve, connect, redis_client: redis.Redis, monkeypatch, public, writer
) -> None:
    monkeypatch.setenv("SLUICE_WS_PUBLIC", public)
    chain = SyntheticChain(seed=7)
    write_lake(settings.lake_uri, chain.take(600))
    write_blocks(redis_client, STREAM, chain.take(100))
    async with serve(settings) as (base, app), connect(base) as client:
        await client.subscribe(0, chain.canonical[0].hash)
        got = await client.blocks(700)
        (conn,) = app[CONNECTIONS]
        assert type(conn.frames) is writer
        write_blocks(redis_client, STREAM, chain.take(50))  # live: direct writes (raw writer)
        got += await client.blocks(50)
    assert got == chain.canonical[:750]
