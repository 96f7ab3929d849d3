"""The Dialogue feed's params are bounded like the websocket's; a subscriber leaving is not an error."""

from __future__ import annotations

import json
import logging

import pytest

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.appkeys import HUB
from pipeline.chain.serve.dialogue_feed import subscribe_dialogue
from pipeline.dialogue.connection import Connection
from pipeline.errors import DuplexError
from pipeline.runtime.ports import free_port
from tests.support.poll import until

from .conftest import STREAM


@pytest.mark.parametrize("depth", [2_000, 30_000])
async def test_deep_json_params_get_invalid_params(settings, serve, caplog, depth) -> None:
    port = free_port()
    caplog.set_level(logging.INFO)
    async with serve(settings.replace(serve_dialogue_port=port)):
        conn = await Connection.connect("127.0.0.1", port)
        try:
            bomb = ("[" * depth + "]" * depth).encode()
            async with conn.duplex(bomb) as duplex:
                with pytest.raises(DuplexError) as err:
                    async for _ in duplex:
                        pass
        finally:
            await conn.close()
    error = json.loads(err.value.data)["error"]
    assert error["code"] == -32602 and "nested deeper" in error["message"], error
    assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"


async def test_a_subscriber_that_stops_early_leaves_one_line_at_most(
    settings, serve, redis_client, caplog
) -> None:
    gen = SyntheticChain(seed=231)
    write_blocks(redis_client, STREAM, gen.take(3))
    port = free_port()
    caplog.set_level(logging.INFO)
    async with serve(settings.replace(serve_dialogue_port=port)) as (_base, app):
        for _ in range(3):
            head = gen.canonical[-1]
            feed = subscribe_dialogue("127.0.0.1", port, head.num, head.hash)
            await anext(feed)
            await until(lambda: len(app[HUB]) == 1, "the subscriber is live")
            write_blocks(redis_client, STREAM, gen.take(300))  # the server is sending...
            await anext(feed)
            await feed.aclose()  # ...when the subscriber goes away
            await until(lambda: len(app[HUB]) == 0, "the server let it go")
    feed_lines = [
        r for r in caplog.records if r.name.startswith(("pipeline.chain", "pipeline.dialogue"))
    ]
    assert not [r for r in feed_lines if r.exc_info], [r.getMessage() for r in feed_lines]
    assert not [r for r in feed_lines if r.levelno >= logging.WARNING], [
        r.getMessage() for r in feed_lines
    ]
    assert len([r for r in feed_lines if "subscriber" in r.getMessage()]) <= 3
