"""The bus's Redis operations, each one atomic (Lua or MULTI), so a crash never loses work.

* Queues are consumed by *claiming*: items move from the queue to its
  ``.inflight`` list in one step and leave it only in the same transaction
  that writes their outcome (backlog, outbox, answers). After a crash the
  inflight list is simply processed again.
* :meth:`BusStore.finish` answers a backlog request at most once: whoever
  removes the backlog entry (reply, expiry scrubber, failed forwarding)
  pushes the one answer; the others find it gone and push nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.coalesce import Coalescer

# KEYS: queue, inflight. ARGV: count. Moves up to count items, returns them.
_CLAIM = """
local items = redis.call('LPOP', KEYS[1], ARGV[1])
if not items then return {} end
redis.call('RPUSH', KEYS[2], unpack(items))
return items
"""

# KEYS: seen, remote. ARGV: seen id, expiry score, body. 1 queued, 0 replayed.
_ACCEPT_REQUEST = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[3])
return 1
"""

# KEYS: backlog, expiry. ARGV: uid, sender twin, answer head, answer tail.
# The answer to the caller is head .. <the request's ret as a JSON string> .. tail.
# 1 answered, 0 uid not in backlog (or already answered), -1 the request was sent to another twin.
_DELIVER_REPLY = """
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry then return 0 end
local dst = string.match(entry, '"dst":%[(%d+)%]')
if dst ~= ARGV[2] then return -1 end
local ret = cjson.decode(entry)['ret']
if type(ret) ~= 'string' then return redis.error_reply('corrupt backlog entry') end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', ret, ARGV[3] .. cjson.encode(ret) .. ARGV[4])
return 1
"""

# KEYS: backlog, expiry, outbox. ARGV: uid, ret, answer, outbox id.
_FINISH = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[4] ~= '' then redis.call('HDEL', KEYS[3], ARGV[4]) end
redis.call('RPUSH', ARGV[2], ARGV[3])
return 1
"""


class BusStore:
    """Typed wrappers around the bus's Redis commands and scripts."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.redis = client
        #: Single commands from concurrent callers go through here; run it as a task.
        self.coalescer = Coalescer(client, reload=self._load_scripts)
        self._claim = client.register_script(_CLAIM)
        self._accept_request = client.register_script(_ACCEPT_REQUEST)
        self._finish = client.register_script(_FINISH)
        self._deliver_reply = client.register_script(_DELIVER_REPLY)

    async def _load_scripts(self) -> None:
        """Load the scripts the coalescer runs by EVALSHA (after Redis lost its script cache)."""
        for script in (self._accept_request, self._deliver_reply, self._finish):
            await self.redis.script_load(script.script)

    async def wait_one(self, queue: str, block_s: int) -> bytes | None:
        """Block up to ``block_s`` seconds for one item, moved atomically to the inflight list."""
        item = await self.redis.blmove(queue, keys.bus_inflight(queue), block_s, "LEFT", "RIGHT")
        return cast(bytes | None, item)

    async def claim(self, queue: str, count: int) -> list[bytes]:
        """Move up to ``count`` more items from ``queue`` to its inflight list."""
        items = await self._claim(keys=[queue, keys.bus_inflight(queue)], args=[count])
        return cast(list[bytes], items)

    async def inflight(self, queue: str, count: int) -> list[bytes]:
        """Items left in the inflight list (by a crash or a failed transaction)."""
        items = await self.redis.lrange(keys.bus_inflight(queue), 0, count - 1)
        return cast(list[bytes], items)

    def release(self, pipe: Any, queue: str, count: int) -> None:
        """Queue the removal of the first ``count`` inflight items into ``pipe``."""
        pipe.ltrim(keys.bus_inflight(queue), count, -1)

    async def accept_request(self, seen_id: str, expires: float, body: bytes) -> bool:
        args: list[str | float | bytes] = [seen_id, expires, body]
        sha = self._accept_request.sha
        result = await self.coalescer.call(
            lambda pipe: pipe.evalsha(sha, 2, keys.bus_seen(), keys.BUS_REMOTE, *args)
        )
        return int(result) == 1

    async def deliver_reply(self, uid: str, sender: int, head: bytes, tail: bytes) -> int:
        """Answer the caller of backlog request ``uid`` with a reply from twin ``sender``.

        The answer is ``head + ret + tail`` with the request's own ``ret`` as a
        JSON string, pushed to that ``ret`` in the same step that drops the backlog
        entry, so it happens at most once. Returns 1 answered, 0 unknown (or
        already answered) uid, -1 when the request went to another twin.
        """
        args: list[str | float | bytes] = [uid, str(sender), head, tail]
        sha = self._deliver_reply.sha
        result = await self.coalescer.call(
            lambda pipe: pipe.evalsha(sha, 2, keys.BUS_BACKLOG, keys.bus_expiry(), *args)
        )
        return int(result)

    async def finish_in(
        self, pipe: Any, uid: str, ret: str, answer: bytes, outbox_id: str = ""
    ) -> None:
        """Queue a :meth:`finish` into a pipeline."""
        await self._finish(
            keys=[keys.BUS_BACKLOG, keys.bus_expiry(), keys.bus_outbox()],
            args=[uid, ret, answer, outbox_id],
            client=pipe,
        )

    async def finish(self, uid: str, ret: str, answer: bytes, outbox_id: str = "") -> bool:
        """Push ``answer`` to ``ret`` and drop the backlog entry, unless it is already answered."""
        sha = self._finish.sha
        args = [uid, ret, answer, outbox_id]
        result = await self.coalescer.call(
            lambda pipe: pipe.evalsha(
                sha, 3, keys.BUS_BACKLOG, keys.bus_expiry(), keys.bus_outbox(), *args
            )
        )
        return int(result) == 1

    async def backlog(self, uids: Sequence[str]) -> list[bytes | None]:
        if not uids:
            return []
        values = await self.redis.hmget(keys.BUS_BACKLOG, list(uids))
        return cast(list[bytes | None], values)

    async def expired(self, now: float, count: int) -> list[str]:
        uids = await self.redis.zrangebyscore(keys.bus_expiry(), "-inf", now, start=0, num=count)
        return [u.decode() for u in cast(list[bytes], uids)]

    async def forget_seen(self, now: float) -> None:
        await self.redis.zremrangebyscore(keys.bus_seen(), "-inf", now)

    async def pending_requests(self, count: int) -> list[tuple[str, bytes, float]]:
        """Up to ``count`` backlog requests, soonest deadline first: (uid, body, deadline)."""
        ranked = await self.redis.zrange(keys.bus_expiry(), 0, count - 1, withscores=True)
        pairs = cast(list[tuple[bytes, float]], ranked)
        bodies = await self.backlog([uid.decode() for uid, _ in pairs])
        return [
            (uid.decode(), body, float(score))
            for (uid, score), body in zip(pairs, bodies, strict=True)
            if body is not None
        ]

    async def outbox_items(self, count: int) -> list[tuple[str, bytes]]:
        """Replies whose POST had not succeeded yet (requests are resent from the backlog)."""
        items: list[tuple[str, bytes]] = []
        async for field, value in self.redis.hscan_iter(keys.bus_outbox(), count=500):
            items.append((field.decode(), value))
            if len(items) >= count:
                break
        return items

    async def drop_outbox(self, outbox_id: str) -> None:
        await self.coalescer.call(lambda pipe: pipe.hdel(keys.bus_outbox(), outbox_id))
