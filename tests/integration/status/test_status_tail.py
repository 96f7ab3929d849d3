"""The status page's tail reads Redis at most once per pause while entries keep coming.

One read per block cost ``sluice serve`` 5-6% of its CPU at 100 blocks/s;
after a read that found entries the tail pauses (``TAIL_INTERVAL_S``) and the
next read (one filtered read of the stream, a script call) takes everything that
came meanwhile. The pause is a gate here, so
the test sees exactly how many reads Redis served, and that the page's view
(head, blocks seen, reorgs) is the same as reading each entry alone.
"""

from __future__ import annotations

import asyncio

import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block
from pipeline.chain.serve.status import StatusBoard
from pipeline.redisio.conn import Role, connect
from pipeline.settings import Settings
from tests.support.poll import until

STREAM = "chain:tailpause"


class GatedBoard(StatusBoard):
    """The board with its pause held until the test opens it (counted)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, set())
        self.pauses = 0
        self.gate = asyncio.Event()

    async def _pause(self) -> None:
        self.pauses += 1
        await self.gate.wait()
        self.gate.clear()


def _add(client: redis.Redis, num: int) -> None:
    block = Block(num=num, hash=num.to_bytes(32, "big"), parent=(num - 1).to_bytes(32, "big"))
    client.xadd(keys.stream(STREAM), {ENTRY_FIELD: encode_block(block)})


def _reads(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_entries_written_during_a_pause_come_in_one_read(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = Settings.load(
        env={}, config_path="/nonexistent", redis_url=redis_url, serve_stream=STREAM,
        chain_streams=(STREAM,),
    )  # fmt: skip
    board = GatedBoard(settings)
    stream = board.streams[STREAM]
    _add(redis_client, 1)
    client = connect(redis_url, Role.TAIL, block_s=1.0, max_connections=2)
    task = asyncio.create_task(board.tail(client))
    try:
        await until(lambda: stream.blocks_seen == 1, "the seed read", within_s=30)
        _add(redis_client, 2)
        await until(lambda: board.pauses == 1, "a pause after the read of block 2", within_s=30)
        assert stream.blocks_seen == 2
        before = _reads(redis_client)
        for num in (3, 4, 5):  # three writes, three round trips: one read takes them all
            _add(redis_client, num)
        board.gate.set()
        await until(lambda: stream.blocks_seen == 5, "blocks 3 to 5", within_s=30)
        await until(lambda: board.pauses == 2, "the pause after them", within_s=30)
        assert _reads(redis_client) - before == 1
        assert stream.head is not None and stream.head.num == 5
        assert stream.reorg_count == 0 and [b.num for b in stream.recent] == [1, 2, 3, 4, 5]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
