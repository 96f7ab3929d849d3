"""What a bus server (an SDK handler process) holds in Redis while it handles requests.

Theory of operation
-------------------
* **claim**: a worker moves requests from ``msgbus.$cmd`` to its server's own
  handling list (:func:`pipeline.keys.bus_handling`) atomically (BLMOVE, then a
  script for up to ``count - 1`` more, one round trip), so a request is never
  only in a process's memory.
* **answer**: the reply push and the request's removal from the handling list
  are one MULTI: a server that dies before it answered still holds the request
  in Redis, one that answered holds nothing.
* **alive**: each server renews ``msgbus.system.handlers[id]`` (a deadline)
  every third of its TTL; a server whose deadline passed is dead (``os._exit``,
  kill -9, a lost machine).
* **redeliver**: any live server takes a dead server's list over (one script:
  the list moves to its own) and hands each request to a handler again, at the
  front of its queue, with the count of its redeliveries in
  ``msgbus.system.redelivered`` (by the request's sha1), which the claim reads
  back: the handler sees it as :attr:`Envelope.redelivered`. A request whose
  handlers died :data:`~pipeline.bus.dead.MAX_ATTEMPTS` times goes to the
  dead-letter list instead, and its caller is answered ``err = "handler
  failed: ..."`` (it does not wait for its ``exp``). A server that stops
  gracefully hands what its cancelled handlers held to the others the same way.

Delivery to handlers is therefore at least once: a handler that died after its
work but before its reply runs again, and knows it does.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import answers, dead
from pipeline.bus.envelope import decode
from pipeline.errors import EnvelopeError

#: Moves up to ARGV[1] more items from KEYS[1] to KEYS[2] (after the BLMOVE of the first),
#: then returns {items, their redelivery counts, 1 if any request is counted at all}.
_CLAIM = """
local moved = {}
for i = 1, tonumber(ARGV[1]) do
  local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not v then break end
  moved[#moved + 1] = v
end
local counts = {}
local any = redis.call('EXISTS', KEYS[3])
if any == 1 then
  for i, v in ipairs(moved) do
    counts[i] = tonumber(redis.call('HGET', KEYS[3], redis.sha1hex(v)) or '0')
  end
end
return {moved, counts, any}
"""

#: Takes over the handling list of server ARGV[1] (KEYS[2]) into KEYS[3] unless it is
#: alive (KEYS[1][ARGV[1]] > ARGV[2]); returns the items taken.
_TAKE_OVER = """
local alive = redis.call('HGET', KEYS[1], ARGV[1])
if alive and tonumber(alive) > tonumber(ARGV[2]) then return {} end
redis.call('HDEL', KEYS[1], ARGV[1])
local out = {}
while true do
  local v = redis.call('LMOVE', KEYS[2], KEYS[3], 'LEFT', 'RIGHT')
  if not v then break end
  out[#out + 1] = v
end
return out
"""

#: One request of a dead server (ARGV[1], sha1 ARGV[2]) out of this server's list
#: KEYS[1]: again at the front of its queue KEYS[3], counted in KEYS[2]; or, at the
#: ARGV[3]-th death, the dead-letter entry ARGV[4] to KEYS[4] and the answer ARGV[5] to
#: KEYS[5]. Returns the count (-1: set aside).
_REQUEUE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
local n = redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
redis.call('EXPIRE', KEYS[2], 86400)
if n < tonumber(ARGV[3]) then
  redis.call('LPUSH', KEYS[3], ARGV[1])
  return n
end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('LPUSH', KEYS[4], ARGV[4])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[6]) - 1)
if ARGV[5] ~= '' then redis.call('RPUSH', KEYS[5], ARGV[5]) end
return -1
"""


def digest(raw: bytes) -> str:
    """The key of a request in ``msgbus.system.redelivered`` (Redis's ``sha1hex``)."""
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


@dataclass(slots=True)
class Redelivered:
    """What one pass of :meth:`Claims.recover` did."""

    again: int = 0  # handed to a handler again
    aside: int = 0  # set aside (dead-letter list) and answered


class Claims:
    """One bus server's requests in Redis (see the module docstring)."""

    def __init__(self, client: aioredis.Redis, server: str, ttl_s: float) -> None:
        self.redis = client
        self.server = server
        self.ttl_s = ttl_s
        self.mine = keys.bus_handling(server)

    async def wait_claim(self, queue: str, block_s: int, count: int) -> list[tuple[bytes, int]]:
        """Up to ``count`` requests of ``queue`` (waiting up to ``block_s`` for the first),
        each with its redelivery count; [] when none came."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.blmove(queue, self.mine, block_s, "LEFT", "RIGHT")
            pipe.eval(_CLAIM, 3, queue, self.mine, keys.bus_redelivered(), count - 1)
            first, more = await pipe.execute(raise_on_error=False)
        if isinstance(first, BaseException):
            raise first
        if isinstance(more, BaseException):
            raise more  # what was moved stays in the handling list: redelivered if we die
        moved, counts, anything_counted = more
        claimed = [
            (cast(bytes, v), int(c)) for v, c in zip(moved, counts or [0] * len(moved), strict=True)
        ]
        if first is None:
            return claimed  # (what came between the BLMOVE's timeout and the script)
        again = 0
        if anything_counted:  # rare: some request was redelivered; is this one?
            again = int(await self.redis.hget(keys.bus_redelivered(), digest(first)) or 0)
        return [(cast(bytes, first), again), *claimed]

    def answered_in(self, pipe: Any, raw: bytes, redelivered: int) -> None:
        """Queue into ``pipe`` (a MULTI with the reply) the end of ``raw``'s handling."""
        pipe.lrem(self.mine, 1, raw)
        if redelivered:
            pipe.hdel(keys.bus_redelivered(), digest(raw))

    async def alive(self) -> None:
        """Renew this server's deadline."""
        await self.redis.hset(keys.bus_handlers(), self.server, str(time.time() + self.ttl_s))

    async def recover(self, max_deaths: int = dead.MAX_ATTEMPTS) -> Redelivered:
        """Hand the requests of every dead server to a handler again (or set them aside)."""
        done = Redelivered()
        now = time.time()
        servers = await self.redis.hgetall(keys.bus_handlers())
        for raw_id, until in servers.items():
            server = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            if server == self.server or float(until) > now:
                continue
            items = await self.redis.eval(
                _TAKE_OVER, 3, keys.bus_handlers(), keys.bus_handling(server), self.mine,
                server, str(now),
            )  # fmt: skip
            await self._requeue(list(reversed(cast(list[bytes], items))), max_deaths, done)
        return done

    async def release(self, max_deaths: int = dead.MAX_ATTEMPTS) -> Redelivered:
        """At a stop: what this server still holds (its handlers were cancelled mid-call)
        goes to a handler again; then this server is forgotten."""
        done = Redelivered()
        items = cast(list[bytes], await self.redis.lrange(self.mine, 0, -1))
        await self._requeue(list(reversed(items)), max_deaths, done)
        await self.redis.hdel(keys.bus_handlers(), self.server)
        return done

    async def _requeue(self, items: list[bytes], max_deaths: int, done: Redelivered) -> None:
        """Each of ``items`` (newest first: each goes to the front of its queue) out of
        this server's list: to a handler again, or set aside and answered."""
        for raw in items:
            queue, answer = _queue_and_answer(raw, max_deaths)
            why = f"its handler died while handling it {max_deaths} time(s)"
            entry = dead.entry(queue, why, raw, attempts=max_deaths)
            names = [self.mine, keys.bus_redelivered(), queue or keys.bus_dead(), keys.bus_dead()]
            result = await self.redis.eval(
                _REQUEUE, 5, *names, keys.BUS_REPLY, raw, digest(raw),
                max_deaths if queue else 1, entry, answer, dead.LIST_MAX,
            )  # fmt: skip
            if int(result) < 0:
                done.aside += 1
            elif int(result) > 0:
                done.again += 1


def _queue_and_answer(raw: bytes, max_deaths: int) -> tuple[str, bytes]:
    """The queue ``raw`` came from and the error reply its caller gets if it is set aside
    ("" and b"" for a request that does not decode: set aside at once, nobody to answer)."""
    try:
        request = decode(raw)
    except EnvelopeError:
        return "", b""
    why = f"handler failed: it died while handling this request {max_deaths} time(s)"
    reply = answers.refusal(request, why, me=request.dst[0] if request.dst else 0)
    return keys.bus_command(request.cmd), reply.encode()
