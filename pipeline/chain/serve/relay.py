"""Relay mode: tail the Redis chain stream and publish every entry to the live hub.

The tail is read through :class:`~pipeline.chain.history.tailread.FilteredReads`, whose
script leaves entries over :data:`~pipeline.blockcodec.MAX_ENTRY_BYTES` in Redis
and names only their id and size: a hostile 20 MB entry costs Redis a copy, never
the server's event loop seconds of socket reads while catch-ups run. No Redis command
blocks without sending what it waits for (``XREAD BLOCK`` sends the entries), so while
nothing is new the tailer waits for Redis to say the key was written
(:class:`~pipeline.chain.serve.tailwake.TailWake`: client tracking, only the key's name
crosses), reading again at least every ``idle_s``; where that cannot be set up it
polls every ``poll_s``.

Several ``sluice serve`` processes can tail the same stream side by side; each
keeps its own hub. On a Redis error the tailer reconnects with a capped
backoff and resumes after the last entry id it published, so a Redis restart
(with its data kept) costs live subscribers nothing. Redis down for longer
than ``give_up_s`` ends the tailer with :class:`RedisUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD
from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.tailread import FilteredReads
from pipeline.chain.metrics import Metrics
from pipeline.chain.produce.producer import LiveBlock, WebsocketHub
from pipeline.chain.serve.tailwake import TailWake
from pipeline.chain.tailindex import decode_servable
from pipeline.errors import BadBatch, RedisUnavailable
from pipeline.loggate import LogGate

log = logging.getLogger(__name__)

#: Entries of one tail read (its bytes: :data:`~pipeline.chain.history.tailread.READ_BYTES`).
READ_COUNT = 1000


class RedisTailer:
    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        hub: WebsocketHub,
        metrics: Metrics,
        *,
        poll_s: float = 0.01,
        idle_s: float = 0.25,
        give_up_s: float = 300.0,
        refused: Refusals | None = None,
    ) -> None:
        self._refused = refused if refused is not None else Refusals(metrics)
        self._redis = redis
        self._key = keys.stream(stream)
        self._hub = hub
        self._metrics = metrics
        self._poll_s = poll_s
        self._give_up_s = give_up_s
        self.last_id: bytes | None = None
        self.up = False
        self._gate = LogGate(log)
        self._reads = FilteredReads(redis, self._key, self._refused)
        self.wake = TailWake(
            redis,
            self._key,
            poll_s=poll_s,
            idle_s=idle_s,
            on_error=metrics.redis_error,
        )

    async def _start_id(self) -> bytes:
        _length, _first, newest = await self._reads.ends()  # its id only: it may be hostile
        return newest or b"0-0"

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self._hub.read_to = None  # nothing more is published: resumption replays again
            await self.wake.close()

    async def _run(self) -> None:
        down_since: float | None = None
        delay = 0.05
        while True:
            try:
                if self.last_id is None:
                    self.last_id = self._hub.read_to = await self._start_id()
                    self._set_up(True)
                reply, _more = await self._reads.page(b"(" + self.last_id, b"+", READ_COUNT)
                self._set_up(True)
                down_since, delay = None, 0.05
                self._gate.ended("redis", "live tailer: redis works again")
            except (
                aioredis.ConnectionError,
                aioredis.TimeoutError,
                aioredis.ResponseError,  # e.g. WRONGTYPE: someone wrote the key; retried until fixed
                OSError,
            ) as exc:
                self._set_up(False)
                self._metrics.redis_error(exc)
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > self._give_up_s:
                    raise RedisUnavailable(f"redis down for over {self._give_up_s}s") from exc
                self._gate.failed("redis", "live tailer: redis error %r; retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if not reply:
                await self.wake.wait()
                continue
            for entry_id, fields in reply:
                # published or refused below, with no await in between
                self.last_id = self._hub.read_to = entry_id
                try:
                    block = decode_servable(fields[ENTRY_FIELD])
                except (BadBatch, KeyError) as exc:
                    self._refused(entry_id, exc)
                    continue
                if not self._refused.admit(
                    entry_id, block.num, block.hash.hex(), block.parent.hex()
                ):
                    continue
                self._metrics.inc("sluice_serve_blocks_live_total")
                self._hub.publish(LiveBlock.from_block(block, self.last_id))
                await self._hub.flush()
                await asyncio.sleep(0)  # let the writers drain between blocks of a burst

    def _set_up(self, up: bool) -> None:
        self.up = up
        self._metrics.set("sluice_serve_redis_up", 1.0 if up else 0.0)
