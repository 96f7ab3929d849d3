"""``/healthz``'s ``head`` comes from whichever source knows the chain (issue 33, 7).

A server in front of a lake of blocks, with nothing new published since it
started, said ``"head": null``: the head was the live hub's alone.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from pipeline import keys
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.appkeys import HUB

from .conftest import STREAM, write_lake


async def _head(base: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(base + "/healthz") as resp:
        doc = await resp.json()
    assert doc["lake"] == "up", doc
    return doc["head"]


async def test_the_head_is_the_lakes_when_redis_holds_no_block(settings, serve) -> None:
    gen = SyntheticChain(seed=331)
    write_lake(settings.lake.uri, gen.take(1600))
    async with serve(settings) as (base, app):
        assert app[HUB].last is None  # nothing live: the lake knows the head
        assert await _head(base) == 1599


async def test_the_head_is_redis_newest_block_before_any_is_published(
    settings, serve, redis_client
) -> None:
    gen = SyntheticChain(seed=332)
    write_lake(settings.lake.uri, gen.take(20))
    write_blocks(redis_client, STREAM, gen.take(5))  # 20..24, written before the start
    async with serve(settings) as (base, app):
        assert app[HUB].last is None
        assert await _head(base) == 24
        redis_client.delete(keys.stream(STREAM))  # emptied: the lake's head again
        assert await _head(base) == 19


async def test_no_block_anywhere_is_a_null_head(settings, serve) -> None:
    async with serve(settings) as (base, _app):
        assert await _head(base) is None
