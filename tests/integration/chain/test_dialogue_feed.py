"""The same feed over a Dialogue duplex on TCP: same blocks, same errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipeline.blockcodec import parse_batch_result, parse_subbatch_result
from pipeline.chain.client.ordered import BlockAssembler
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.dialogue_feed import subscribe_dialogue
from pipeline.errors import DuplexError
from pipeline.runtime.ports import free_port

from .conftest import STREAM, write_lake


async def test_dialogue_duplex_gets_the_same_blocks(settings, serve, connect, redis_client) -> None:
    gen = SyntheticChain(seed=61, prefixes=("s/", "t/"))
    write_lake(settings.lake.uri, gen.take(20))
    write_blocks(redis_client, STREAM, gen.take(10))
    port = free_port()
    async with serve(settings.replace(serve_dialogue_port=port)) as (base, _app):
        asm = BlockAssembler()
        got = []
        feed = subscribe_dialogue("127.0.0.1", port, 5, gen.canonical[5].hash, ["t/"])
        async for result in feed:
            block = (
                asm.batch(parse_batch_result(result))
                if result["type"] == "batch"
                else asm.subbatch(*parse_subbatch_result(result))
            )
            if block is not None:
                got.append(block)
                if len(got) == 25:
                    break
        await feed.aclose()
        results: list[dict] = []
        async with connect(base) as client:
            await client.subscribe(5, gen.canonical[5].hash, patterns=["t/"], weight=False)
            ws_blocks = await client.blocks(25, results=results)
        assert got == ws_blocks
        assert [b.num for b in got] == list(range(5, 30))
        assert all(list(b.batches) == ["t/"] for b in got)

        bad = subscribe_dialogue("127.0.0.1", port, 0, b"\x00" * 32, ["(("])
        with pytest.raises(DuplexError) as err:
            await anext(bad)
        await bad.aclose()
        error = json.loads(err.value.data)["error"]
        assert error["code"] == -32602 and "does not compile" in error["message"]


async def test_dialogue_from_block_zero_without_a_hash(settings, serve, redis_client) -> None:
    """The chain guide's call: no hash known yet (None) starts from the canonical block."""
    gen = SyntheticChain(seed=62, prefixes=("s/",))
    write_blocks(redis_client, STREAM, gen.take(5))
    port = free_port()
    async with serve(settings.replace(serve_dialogue_port=port)):
        feed = subscribe_dialogue("127.0.0.1", port, 0, None)
        nums = []
        async for result in feed:
            if result["type"] == "batch":
                nums.append(int(result["num"], 16))
                if len(nums) == 5:
                    break
        await feed.aclose()
        assert nums == [0, 1, 2, 3, 4]


async def test_dialogue_refusals_carry_public_texts_only(settings, serve, redis_client) -> None:
    gen = SyntheticChain(seed=63)
    blocks = gen.take(30)
    write_lake(settings.lake.uri, blocks[:10])
    write_blocks(redis_client, STREAM, blocks[20:])  # 10..19 are nowhere: a history gap
    port = free_port()
    async with serve(settings.replace(serve_dialogue_port=port)):
        big = subscribe_dialogue("127.0.0.1", port, 2**63, b"\x00" * 32, [])
        with pytest.raises(DuplexError) as err:
            await anext(big)
        await big.aclose()
        error = json.loads(err.value.data)["error"]
        assert error["code"] == -32602 and "block number" in error["message"]

        gap = subscribe_dialogue("127.0.0.1", port, 0, blocks[0].hash, [])
        with pytest.raises(DuplexError) as err:
            async for _ in gap:
                pass
        await gap.aclose()
        assert b"history gap" in err.value.data and b"redis starts at" not in err.value.data


async def test_params_that_are_not_json_get_invalid_params_only(settings, serve) -> None:
    """The decoder's own text (positions, internals) stays on the server: only a public text."""
    from pipeline.dialogue.connection import Connection

    port = free_port()
    async with serve(settings.replace(serve_dialogue_port=port)):
        conn = await Connection.connect("127.0.0.1", port)
        try:
            async with conn.duplex(b'["streams", 0x') as duplex:
                with pytest.raises(DuplexError) as err:
                    async for _ in duplex:
                        pass
        finally:
            await conn.close()
    error = json.loads(err.value.data)["error"]
    assert error == {"code": -32602, "message": "invalid params: not JSON"}


async def test_a_dialogue_subscriber_is_counted_while_served(settings, serve, redis_client) -> None:
    """The feed server's ``connections`` hold a subscriber while it is served: serve's memory
    releaser reads them so that a Dialogue subscriber, like a websocket one, is never paused
    by a full collection."""
    from pipeline.chain.serve.appkeys import RESUMPTION
    from pipeline.chain.serve.dialogue_feed import dialogue_server

    gen = SyntheticChain(seed=64)
    write_blocks(redis_client, STREAM, gen.take(5))
    port = free_port()
    async with serve(settings) as (_base, app):
        server = dialogue_server(app[RESUMPTION], "127.0.0.1", port, send_buffer=1 << 16)
        await server.start()
        try:
            assert not server.connections
            feed = subscribe_dialogue("127.0.0.1", port, 0, None)
            first = await anext(feed)
            assert first["type"] == "batch" and len(server.connections) == 1
            await feed.aclose()
            for _ in range(200):  # the server sees the peer's close on its next read
                if not server.connections:
                    break
                await asyncio.sleep(0.01)
            assert not server.connections, "a subscriber that left is still counted"
        finally:
            await server.close()
