"""Concurrent catch-ups from the lake share the encoded blocks (pipeline/chain/history/shared.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.serve.appkeys import METRICS, RESUMPTION

from .conftest import write_lake


@pytest.mark.parametrize("lag_s", [0.0, 1.5], ids=["together", "one-behind"])
async def test_two_catch_ups_at_once_share_encoded_blocks_and_each_gets_every_block(
    settings, serve, connect, lag_s
) -> None:
    chain = SyntheticChain(seed=12)
    # 16 MB of frames: more than the sockets' buffers hold, so the first catch-up is
    # still reading the lake when the second one starts
    blocks = [
        dataclasses.replace(b, updates={**b.updates, "big": os.urandom(4000)})
        for b in chain.take(2000)
    ]
    write_lake(settings.lake.uri, blocks)
    async with (
        serve(settings.replace(serve_send_buffer=256)) as (base, app),
        connect(base) as one,
        connect(base) as two,
    ):
        # both subscribed before either reads: the first waits for room in its buffer
        await one.subscribe(0, blocks[0].hash)
        await two.subscribe(0, blocks[0].hash)
        got_one, got_two = await asyncio.gather(
            one.blocks(len(blocks), wait_s=120), two.blocks(len(blocks), wait_s=120)
        )
        assert got_one == blocks and got_two == blocks
        values = app[METRICS].values
        hits = values["sluice_serve_catchup_shared_hits_total"]
        assert hits > 0, {k: v for k, v in values.items() if "shared" in k}
        assert len(app[RESUMPTION].shared) == 0  # dropped once nobody shares
        # a lone catch-up neither looks up nor fills it. Connected only now: a client
        # answers the server's pings only while it reads, and one left unread while the
        # two above took longer than the heartbeat (load) was closed by the server
        async with connect(base) as alone:
            await alone.subscribe(0, blocks[0].hash)
            assert await alone.blocks(len(blocks), wait_s=120) == blocks
        assert values["sluice_serve_catchup_shared_hits_total"] == hits
        assert len(app[RESUMPTION].shared) == 0
