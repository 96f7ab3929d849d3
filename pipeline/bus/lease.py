"""One active bus per twin: a lease in the twin's Redis, with a fencing token.

* ``msgbus.system.lease`` holds ``"<token> <owner>"`` with a TTL (``SET ... PX``):
  the active bus renews it every quarter of the TTL; a second ``sluice bus`` for
  the same twin finds it taken and waits as a hot standby, trying again at the
  same pace, and takes over once the lease lapses (the active died, froze or
  lost Redis for longer than the TTL).
* ``msgbus.system.lease.token`` is the fencing token: ``INCR``-ed by every new
  owner, and never below the Redis server's clock in microseconds, so a Redis
  that lost it (a wipe, a restart without persistence, a failover to a replica
  that lagged) still issues a token larger than any issued before.
* Every write of the bus that matters checks the token in the same atomic step
  (the claims, the batch transactions, the answers; see
  :meth:`pipeline.bus.store.BusStore.fenced`): a bus whose lease was taken over
  writes nothing more (:class:`~pipeline.errors.Fenced`) and steps down to standby.

The owner id (host, port, pid and a random part) says who holds the lease, for
people and for a bus restarted in the same process (see :func:`owner_id`);
tokens decide what may be written.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import cast

import redis.asyncio as aioredis

#: The lease: ``"<token> <owner>"``, expiring unless renewed.
LEASE = "msgbus.system.lease"
#: The fencing token of the current (or last) owner.
FENCE = "msgbus.system.lease.token"

# KEYS: lease, fence. ARGV: owner, ttl ms. Returns {token, owner}: token '0' when the
# lease is someone else's (owner is theirs). A lease this owner holds is renewed.
ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local token, owner = string.match(cur, '^(%d+) (.*)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {token, owner}
  end
  return {'0', owner or cur}
end
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = redis.call('INCR', KEYS[2])
if token < floor then
  token = floor
  redis.call('SET', KEYS[2], string.format('%.0f', token))
end
token = string.format('%.0f', token)
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {token, ARGV[1]}
"""

# KEYS: lease, fence. ARGV: token, owner, ttl ms. 1 renewed; 0 lost (another token).
# A lapsed lease nobody took since (the token is still this one) is taken again.
RENEW = """
local mine = ARGV[1] .. ' ' .. ARGV[2]
local cur = redis.call('GET', KEYS[1])
if cur == mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
if not cur and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[1], mine, 'PX', ARGV[3])
  return 1
end
return 0
"""

# KEYS: lease. ARGV: token, owner. Drops the lease if it is this owner's (a clean stop).
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] .. ' ' .. ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def staging(queue: str) -> str:
    """The list a lease holder's claim of ``queue`` moves its first item to, before the
    fenced step (see ``BusStore.wait_claim``): what a bus that lost the lease moved
    there stays for the owner's next claim, which takes it first."""
    return f"{queue}.staging"


#: This process's part of the owner ids it makes (see :func:`owner_id`).
_PROCESS_PART = secrets.token_hex(3)
#: Owner ids of this process's buses that have not stopped yet.
_LIVE: set[str] = set()


def owner_id(host: str, port: int) -> str:
    """``host:port/pid/random``: who holds a lease, for the log and ``/healthz``.

    A bus started again in this process on the same ``host:port`` once the
    previous one stopped (:func:`retire`) gets the same id back: it takes up a
    lease its predecessor could not give up (Redis away at the stop) at once,
    instead of waiting for it to lapse. While the previous one runs, another id.
    """
    name = host if host not in ("", "0.0.0.0", "127.0.0.1", "::") else socket.gethostname()
    owner = f"{name}:{port}/{os.getpid()}/{_PROCESS_PART}"
    while owner in _LIVE:
        owner = f"{name}:{port}/{os.getpid()}/{secrets.token_hex(3)}"
    _LIVE.add(owner)
    return owner


def retire(owner: str) -> None:
    """The bus of ``owner`` stopped, every task of it ended: the id may be used again."""
    _LIVE.discard(owner)


class Lease:
    """The lease of one twin's bus in its Redis. ``token`` is empty unless held."""

    def __init__(self, client: aioredis.Redis, *, ttl_s: float, owner: str) -> None:
        self.redis = client
        self.ttl_ms = max(int(ttl_s * 1000), 300)
        self.owner = owner
        self.token = ""
        self._acquire = client.register_script(ACQUIRE)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)

    @property
    def pace_s(self) -> float:
        """Seconds between renewals (and between a standby's attempts)."""
        return self.ttl_ms / 4000

    async def acquire(self) -> str:
        """Take the lease if it is free (or this owner's); returns the holder's owner id."""
        token, holder = await self._acquire(keys=[LEASE, FENCE], args=[self.owner, self.ttl_ms])
        token, holder = _text(token), _text(holder)
        self.token = token if token != "0" else ""
        return holder

    async def renew(self) -> bool:
        """Extend the held lease; False (and ``token`` cleared) when it was lost."""
        if not self.token:
            return False
        args: list[str | int] = [self.token, self.owner, self.ttl_ms]
        if int(await self._renew(keys=[LEASE, FENCE], args=args)) == 1:
            return True
        self.token = ""
        return False

    async def release(self) -> None:
        """Give the lease up (a clean stop): the standby takes over at once."""
        if self.token:
            await self._release(keys=[LEASE], args=[self.token, self.owner])
            self.token = ""

    async def holder(self) -> str:
        """The owner id holding the lease now ('' when none)."""
        raw = cast(bytes | None, await self.redis.get(LEASE))
        return _text(raw).partition(" ")[2] if raw else ""


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
