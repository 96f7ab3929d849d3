"""Hostile entries in the Redis chain stream: refused, counted once, and nothing else changes.

15 entries written straight into the stream, each posing as the next block
(a 20 MB value, a million keys, 100,000-deep msgpack, wrong types), between
good blocks: the live subscriber, a subscriber catching up from block 0 and
``/healthz`` go on as if they were not there; ``/metrics`` counts each once.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import msgpack

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from tests.support.poll import until

from .conftest import STREAM


def _hostile(num: int, parent: bytes) -> list[bytes]:
    """15 entries posing as block ``num`` on top of ``parent``."""

    def block(i: int, **fields: Any) -> bytes:
        body = {"num": num, "hash": bytes([0xEE, i]) * 16, "parent": parent, **fields}
        out: bytes = msgpack.packb(body, use_bin_type=True)
        return out

    many = msgpack.packb({f"k{i}": b"" for i in range(1_000_000)}, use_bin_type=True)
    head = block(2)
    million = b"\x84" + head[1:] + msgpack.packb("updates") + many
    deep = b"\x84" + block(3)[1:] + msgpack.packb("updates") + b"\x91" * 100_000 + b"\xc0"
    return [
        block(0, updates={"k": b"\x00" * (20 << 20)}),
        block(1, updates={f"k{i}": b"\x00" * 1000 for i in range(25_000)}),  # 25 MB
        million,
        b"\x91" * 100_000 + b"\xc0",
        deep,
        block(4, updates={"k": "a str"}),
        block(5, updates=[b"x"]),
        block(6, deletes={"k": 1}),
        block(7, subbatches=[{"id": 5, "updates": {}}]),
        block(8, subbatches=["x"]),
        block(9, batches={"p": 1}),
        block(10, weight="heavy"),
        msgpack.packb({"num": "1", "hash": parent, "parent": parent}),
        msgpack.packb([num, parent]),
        b"\xc1 not msgpack",
    ]


async def test_hostile_entries_are_skipped_and_counted_while_serving_goes_on(
    settings, serve, connect, redis_client, caplog
) -> None:
    gen = SyntheticChain(seed=211)
    write_blocks(redis_client, STREAM, gen.take(20))
    caplog.set_level(logging.WARNING)
    async with serve(settings) as (base, _app), connect(base, max_msg_size=1 << 22) as live:
        head = gen.canonical[-1]
        await live.subscribe(head.num, head.hash)
        assert [b.num for b in await live.blocks(1)] == [head.num]
        bad = _hostile(head.num + 1, head.hash)
        for data in bad:
            redis_client.xadd(keys.stream(STREAM), {ENTRY_FIELD: data})
        more = gen.take(5)
        write_blocks(redis_client, STREAM, more)
        # the live subscriber gets the good blocks, and only them
        assert await live.blocks(5) == more
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/healthz") as resp:
                assert resp.status == 200, await resp.text()
            # a subscriber from block 0 reads them through the tail index and replay
            async with connect(base, max_msg_size=1 << 22) as fresh:
                await fresh.subscribe(0, gen.canonical[0].hash)
                assert await fresh.blocks(25) == gen.canonical[:25]

            async def refused() -> float:
                async with http.get(base + "/metrics") as resp:
                    for line in (await resp.text()).splitlines():
                        if line.startswith("sluice_serve_entries_refused_total "):
                            return float(line.split()[1])
                return -1.0

            await until(refused, "15 refusals counted", accept=lambda v: v == len(bad))
    # each refused entry logged once, whoever met it (tailer, index, replay)
    lines = [r for r in caplog.records if "refused chain entry" in r.getMessage()]
    assert len(lines) == len(bad), [r.getMessage() for r in lines]
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


async def test_a_refused_entry_is_not_read_again_by_each_catch_up(
    settings, serve, connect, redis_client
) -> None:
    """The tail reads step around entries already refused: 20 MB is fetched once, not per subscriber."""
    gen = SyntheticChain(seed=212)
    write_blocks(redis_client, STREAM, gen.take(10))
    head = gen.canonical[-1]
    big = msgpack.packb(
        {
            "num": head.num + 1,
            "hash": b"\xee" * 32,
            "parent": head.hash,
            "updates": {"k": b"\0" * (20 << 20)},
        },
        use_bin_type=True,
    )
    redis_client.xadd(keys.stream(STREAM), {ENTRY_FIELD: big})
    write_blocks(redis_client, STREAM, gen.take(30))  # (the status page reads the newest 12)
    async with serve(settings) as (base, app), aiohttp.ClientSession() as http:

        async def refused() -> float:
            async with http.get(base + "/metrics") as resp:
                for line in (await resp.text()).splitlines():
                    if line.startswith("sluice_serve_entries_refused_total "):
                        return float(line.split()[1])
            return -1.0

        # read once, by the tail index the server builds at start
        await until(refused, "the entry refused at start", accept=lambda v: v == 1)
        for _ in range(3):
            before = redis_client.info("stats")["total_net_output_bytes"]
            async with connect(base) as client:
                await client.subscribe(0, gen.canonical[0].hash)
                assert await client.blocks(40) == gen.canonical[:40]
            read = redis_client.info("stats")["total_net_output_bytes"] - before
            assert read < 1 << 20, f"a catch-up read {read} bytes"
