"""Relay mode: tail the Redis chain stream and publish every entry to the live hub.

The tail is read through a Lua script (:data:`_TAIL_READ`) that leaves entries
over :data:`~pipeline.blockcodec.MAX_ENTRY_BYTES` in Redis and names only their id
and size: a hostile 20 MB entry costs Redis a copy, never the server's event loop
seconds of socket reads while catch-ups run. No Redis command blocks without
sending what it waits for, so the tailer polls (every ``poll_s`` while nothing is new:
a few hundred bytes, 100 times a second) instead of ``XREAD BLOCK``.

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
from typing import Any, cast

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, MAX_ENTRY_BYTES
from pipeline.chain.entries import Refusals
from pipeline.chain.metrics import Metrics
from pipeline.chain.planning import Entries, decode_servable
from pipeline.chain.producer import LiveBlock, WebsocketHub
from pipeline.errors import BadBatch, RedisUnavailable
from pipeline.loggate import LogGate
from pipeline.redisconn import checkpoint

log = logging.getLogger(__name__)

#: The entries after ARGV[1]: at most ARGV[2], and no more once ARGV[4] bytes are
#: taken (one at least). An entry whose values add up to more than ARGV[3] bytes comes
#: back as {id, size}: it never leaves Redis. Read only: it runs on replicas too.
_TAIL_READ = """
local out, last = {}, ARGV[1]
local n, max, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for _ = 1, n do
  local e = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1)
  if #e == 0 then break end
  last = e[1][1]
  local fields, size = e[1][2], 0
  for j = 2, #fields, 2 do size = size + #fields[j] end
  if size > max then
    out[#out + 1] = {last, size}
  else
    out[#out + 1] = e[1]
    budget = budget - size
    if budget <= 0 then break end
  end
end
return out
"""
#: Entries and bytes of one tail read.
READ_COUNT, READ_BYTES = 1000, 2 * MAX_ENTRY_BYTES


class RedisTailer:
    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        hub: WebsocketHub,
        metrics: Metrics,
        *,
        poll_s: float = 0.01,
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
        self._read = redis.register_script(_TAIL_READ)

    async def _start_id(self) -> bytes:
        newest = cast(Entries, await self._redis.xrevrange(self._key, max="+", min="-", count=1))
        return newest[0][0] if newest else b"0-0"

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self._hub.read_to = None  # nothing more is published: resumption replays again

    async def _run(self) -> None:
        down_since: float | None = None
        delay = 0.05
        while True:
            try:
                if self.last_id is None:
                    self.last_id = self._hub.read_to = await self._start_id()
                    self._set_up(True)
                reply = cast(
                    list[tuple[bytes, Any]],
                    await self._read(
                        keys=[self._key],
                        args=[self.last_id, READ_COUNT, MAX_ENTRY_BYTES, READ_BYTES],
                    ),
                )
                checkpoint()
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
                self._metrics.inc("sluice_serve_redis_errors_total")
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > self._give_up_s:
                    raise RedisUnavailable(f"redis down for over {self._give_up_s}s") from exc
                self._gate.failed("redis", "live tailer: redis error %r; retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if not reply:
                await asyncio.sleep(self._poll_s)
                continue
            for entry_id, fields in reply:
                # published or refused below, with no await in between
                self.last_id = self._hub.read_to = entry_id
                if isinstance(fields, int):
                    self._refused(
                        entry_id, BadBatch(f"entry of {fields} bytes: at most {MAX_ENTRY_BYTES}")
                    )
                    continue
                fields = dict(zip(fields[::2], fields[1::2], strict=True))
                try:
                    block = decode_servable(fields[ENTRY_FIELD])
                except (BadBatch, KeyError) as exc:
                    self._refused(entry_id, exc)
                    continue
                self._metrics.inc("sluice_serve_blocks_live_total")
                self._hub.publish(LiveBlock.from_block(block, self.last_id))
                await self._hub.flush()
                await asyncio.sleep(0)  # let the writers drain between blocks of a burst

    def _set_up(self, up: bool) -> None:
        self.up = up
        self._metrics.set("sluice_serve_redis_up", 1.0 if up else 0.0)
