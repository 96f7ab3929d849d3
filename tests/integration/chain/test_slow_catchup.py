"""A subscriber that stops reading during catch-up is closed with 1008 and counted.

Catch-up waits for room in the subscriber's send buffer; a reader that never
makes room was waited for forever (its subscriptions, buffers and plans held,
``sluice_serve_slow_disconnects_total`` 0). Now the wait is bounded by
``SLUICE_SERVE_STALL_S``; live subscribers beside it go on.
"""

from __future__ import annotations

import aiohttp

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.wsconn import MAX_SUBSCRIPTIONS
from tests.support.poll import until

from .conftest import STREAM


async def _metric(http: aiohttp.ClientSession, base: str, name: str) -> float:
    async with http.get(base + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return -1.0


async def test_a_catchup_that_is_never_read_is_closed_with_1008(
    settings, serve, connect, redis_client
) -> None:
    gen = SyntheticChain(seed=241, prefixes=("a/", "b/", "c/"))
    write_blocks(redis_client, STREAM, gen.take(3000))
    # the heartbeat out of the way: neither client reads while the test waits for the
    # stall, so neither answers the server's pings: a wait past the conftest's 5 s
    # heartbeat (load) let the server close both (no 1008, no live blocks; seen with a 9 s pause)
    settings = settings.replace(serve_stall_s=1.0, serve_send_buffer=64, serve_heartbeat_s=120.0)
    async with (
        serve(settings) as (base, _app),
        aiohttp.ClientSession() as http,
        connect(base) as live,
    ):
        head = gen.canonical[-1]
        await live.subscribe(head.num, head.hash)
        await live.blocks(1)
        # 16 subscriptions from block 0 on a connection whose reader never reads
        # (aiohttp stops reading the socket once its small buffer is full)
        ws = await http.ws_connect(base + "/ws", max_msg_size=1 << 20)
        zero = "0x" + gen.canonical[0].hash.hex()
        for i in range(MAX_SUBSCRIPTIONS):
            await ws.send_json(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "cardinal_subscribe",
                    "params": ["streams", "0x0", zero, []],
                }
            )
        slow = "sluice_serve_slow_disconnects_total"
        await until(lambda: _metric(http, base, slow), "a slow disconnect", within_s=60)
        # reading now: what was queued, then the close with its code and reason
        while (msg := await ws.receive(timeout=30)).type == aiohttp.WSMsgType.TEXT:
            pass
        assert ws.close_code == 1008, (msg, ws.close_code)
        assert "too slow" in str(msg.extra)
        await ws.close()
        # the live subscriber beside it goes on
        more = gen.take(3)
        write_blocks(redis_client, STREAM, more)
        assert await live.blocks(3) == more
