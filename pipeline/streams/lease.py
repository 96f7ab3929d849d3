"""Consumer leases: at most one node consumes a stream while its lease lives.

The lease is one Redis key (``keys.consumer_lease``) holding the holder's id,
set with ``NX PX`` semantics and renewed by its holder, all inside one Lua
script so acquire-or-renew is atomic. A holder that dies stops renewing and
the lease expires after ``ttl_ms``; the same holder (same node name) coming
back takes its lease again at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from pipeline import keys

#: Longest lease a consumer may ask for.
MAX_TTL_MS = 600_000

_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, ARGV[1], tonumber(ARGV[2])}
end
return {0, cur, redis.call('PTTL', KEYS[1])}
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class LeaseState:
    granted: bool
    holder: str
    ttl_ms: int


class Leases:
    """Acquire, renew and release consumer leases on one Redis."""

    def __init__(self, redis: Redis) -> None:
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)

    async def acquire(self, stream: str, holder: str, ttl_ms: int) -> LeaseState:
        """Take or renew the lease on ``stream`` for ``holder``."""
        ttl = max(1, min(int(ttl_ms), MAX_TTL_MS))
        granted, cur, left = await self._acquire(
            keys=[keys.consumer_lease(stream)], args=[holder, ttl]
        )
        who = cur.decode() if isinstance(cur, bytes) else str(cur)
        return LeaseState(bool(granted), who, int(left))

    async def release(self, stream: str, holder: str) -> bool:
        released = await self._release(keys=[keys.consumer_lease(stream)], args=[holder])
        return bool(released)
