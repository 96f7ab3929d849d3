"""The Redis of one chain history: one server, or a Sentinel group the nemesis fails over.

A seed draws its Redis once, from its own stream of draws (:func:`draws_sentinel`:
about one seed in four, the same on every run; a separate stream, so the
schedules of the seeds that keep one server are the ones they always drew):

- :class:`SingleRedis`: one ``redis-server`` (appendonly, fsync always), which
  the nemesis restarts on its files (``restart_redis``) and reaches through a
  Toxiproxy link (``redis_link``);
- :class:`SentinelRedis`: a master, one replica and three Sentinels
  (:class:`tests.support.redisha.LocalSentinels`). Serve, ``sluice produce``
  and the lake jobs get its ``redis+sentinel://`` URL (no proxy between: the
  link follows the master), ``SLUICE_REDIS_MIN_REPLICAS=1`` (Sluice's setting
  for writes that must survive a master's death), and the checker's own client
  is redis-py's ``Sentinel.master_for``. Its fault is :meth:`SentinelRedis.failover`:
  ``kill -9`` of the master, the Sentinels promote the replica, the old master
  is started again as the new one's replica, and the step ends when the group
  is whole (every Sentinel names the master, its replica linked).

**What the model learns, and what a failover may lose.** The model is every
block in stream order *from Redis itself*, and on Sentinel "Redis" is what
the group keeps, not what one master once answered: replication is
asynchronous, so a write the master acknowledged may be lost with it. Before
the model reads the stream, :meth:`SentinelRedis.fence` writes a fence key and
sends ``WAIT 1`` on the same connection: replication is one ordered stream, so
once the replica acknowledged the fence it holds every write before it, the
checker's, ``sluice produce``'s and the trims'. The model therefore learns
only blocks the replica holds, and the replica is what the Sentinels promote:
a failover never takes a block from the model. (A ``WAIT`` the replica does not
answer in time fails the run: the history could not be judged.)

A write after the last fence can still die with the master: a trim (the
stream then holds the trimmed entries again; the model loses nothing), or, in a
failover under ``sluice produce``, a block (produce retries its unconfirmed
appends by content on the new master). Such a block is never learned, unless
its retry puts it back.
No consumer is owed such a block; but one that was served it must have it
removed by the end: the checker's rule is unchanged, every consumer ends on
the model's chain. That is the sound rule: the model's chain is what a consumer
joining later, or a restarted serve, reads from the group; a live consumer
still holding a block the group lost would disagree with them for ever.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import redis
import redis.sentinel

from pipeline.local.redisserver import LocalRedis
from tests.support.redisha import NODE_TIMEOUT_MS, SERVICE, LocalSentinels

#: the share of seeds whose Redis is a Sentinel group
SENTINEL_SHARE = 0.25
#: the fence key the checker writes before it reads (see the module doc)
FENCE_KEY = "chain-history:fence"
#: how long a fence's ``WAIT`` waits for the replica, and how often it is sent again
FENCE_WAIT_MS = 5000
FENCE_TRIES = 6


def draws_sentinel(seed: int) -> bool:
    """Whether seed ``seed``'s history runs on a Sentinel group (its own stream of draws)."""
    return random.Random(f"chain-redis/{seed}").random() < SENTINEL_SHARE


class SingleRedis:
    """One ``redis-server`` (appendonly, fsync always: a restart loses nothing)."""

    sentinel = False
    kind = "single"

    def __init__(self, directory: Path) -> None:
        self.server = LocalRedis(directory, aof=True)
        self._client: redis.Redis | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def env(self) -> dict[str, str]:
        """What the Sluice processes of this history get beside the URL."""
        return {}

    def start(self) -> None:
        self.server.start()

    @property
    def client(self) -> redis.Redis:
        """The checker's own client (the model reads and the checker writes through it)."""
        if self._client is None:
            self._client = redis.Redis.from_url(self.url)
        return self._client

    def fence(self) -> None:
        """One server: what it answered is what it holds (appendonly, fsync always)."""

    async def restart(self, rng: random.Random) -> str:
        await asyncio.to_thread(self.server.stop)
        await asyncio.sleep(rng.uniform(0, 1))
        await asyncio.to_thread(self.server.start)
        return "restart_redis"

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
        self.server.stop()


class SentinelRedis:
    """A Sentinel group (a master, a replica, three Sentinels) and its failover."""

    sentinel = True
    kind = "sentinel"

    def __init__(self, directory: Path, *, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        self.group = LocalSentinels(directory, node_timeout_ms=node_timeout_ms)
        self._sentinels: redis.sentinel.Sentinel | None = None
        self._client: redis.Redis | None = None
        #: ``time.monotonic()`` when the last failover's replica was promoted
        self.promoted_at = 0.0

    @property
    def url(self) -> str:
        return self.group.url

    def env(self) -> dict[str, str]:
        return {"SLUICE_REDIS_MIN_REPLICAS": "1"}

    def start(self) -> None:
        self.group.start()

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._sentinels = redis.sentinel.Sentinel(
                [("127.0.0.1", s.port) for s in self.group.sentinels],
                socket_timeout=2,
                socket_connect_timeout=1,
            )
            self._client = self._sentinels.master_for(
                SERVICE, socket_timeout=10, socket_connect_timeout=1
            )
        return self._client

    def fence(self) -> None:
        """Until the replica holds every write made so far (see the module doc)."""
        for _ in range(FENCE_TRIES):
            pipe = self.client.pipeline(transaction=False)
            pipe.incr(FENCE_KEY)
            pipe.execute_command("WAIT", 1, FENCE_WAIT_MS)
            _, acks = pipe.execute()
            if int(acks) >= 1:
                return
        raise TimeoutError(
            f"the replica acknowledged no fence in {FENCE_TRIES} x {FENCE_WAIT_MS} ms: "
            "the history cannot be judged"
        )

    async def failover(self, rng: random.Random) -> str:
        """``kill -9`` of the master, the replica promoted, the old master back as its
        replica, the group whole; what happened, with the times, for the report."""
        group = self.group
        old = await asyncio.to_thread(group.master)
        t0 = time.monotonic()
        await asyncio.to_thread(group.kill_master)
        await asyncio.to_thread(group.wait_failed_over, old)
        self.promoted_at = time.monotonic()  # the bus's checker dates a loss by it
        promoted = self.promoted_at - t0
        await asyncio.sleep(rng.uniform(0, 1))  # a while with no replica
        await asyncio.to_thread(group.heal)
        whole = time.monotonic() - t0
        if self._client is not None:
            # its pooled connections went to the dead master: new ones ask the Sentinels
            self._client.connection_pool.disconnect()
        new = await asyncio.to_thread(group.master)
        return (
            f"failover {old.port} -> {new.port}: promoted after {promoted:.1f}s, "
            f"whole after {whole:.1f}s"
        )

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
        for sentinel in self._sentinels.sentinels if self._sentinels is not None else []:
            sentinel.close()
        self.group.stop()


RedisOfHistory = SingleRedis | SentinelRedis


def for_seed(seed: int, directory: Path) -> RedisOfHistory:
    """The Redis seed ``seed`` draws (:func:`draws_sentinel`), in ``directory``."""
    if draws_sentinel(seed):
        return SentinelRedis(directory / "sentinel")
    return SingleRedis(directory / "redis")


__all__ = [
    "FENCE_KEY",
    "SENTINEL_SHARE",
    "RedisOfHistory",
    "SentinelRedis",
    "SingleRedis",
    "draws_sentinel",
    "for_seed",
]
