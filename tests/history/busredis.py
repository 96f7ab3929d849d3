"""A twin's Redis in a bus history: one server, or a Sentinel group the nemesis fails over.

A seed draws its twins' Redis once (:func:`tests.history.busschedule.draw_variant`):
one ``redis-server`` each (:class:`~pipeline.local.redisserver.LocalRedis`,
appendonly, fsync always), or a Sentinel group each (the chain checker's
:class:`tests.history.redisgroup.SentinelRedis`: a master, one replica, three
Sentinels). Both buses, the handler and the callers get the group's
``redis+sentinel://`` URL; the buses also ``SLUICE_REDIS_MIN_REPLICAS=1``.

**What a failover lost, proven** (:func:`failover`). Replication is
asynchronous: a write the master took may die with it. The nemesis makes that
provable, not guessed:

1. a fence: ``INCR`` and ``WAIT 1`` on the master (:meth:`SentinelRedis.fence`);
   once the replica acknowledged it, it holds every write made before the
   fence began (replication is one ordered stream);
2. on some failovers (``lag``) the replica is cut off: the master takes no new
   connection (``maxclients`` set to the clients it has) and drops its
   replica's link (``CLIENT KILL TYPE replica``), so what it takes from then
   on never reaches the replica (on loopback a replica otherwise lags by
   nothing: a killed link is resumed within milliseconds, and what a killed
   master had sent is read all the same);
3. ``CLIENT PAUSE WRITE`` on the master, then its ``master_repl_offset``: no
   write changes it any more (nor an expiry: Redis holds them while
   paused, and the data nodes send no replication pings), so it is the master's
   last offset when it is killed -9 just after;
4. once the replica is promoted, its ``second_repl_offset`` is one past the
   last byte of the old master's stream it held.

If the promoted replica held fewer bytes than the master's last offset, the
failover lost writes: the twin gets a *partial* loss (:class:`Loss`) from the
fence on (everything before it survived) to the promotion. Otherwise it lost
nothing, and the checker excuses nothing. (The bytes lost may, rarely, be only
a key's expiry, which the new master does by itself: the proof is of lost
bytes, so it errs towards a loss, and only for what followed the fence.)
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import redis

from pipeline.local.redisserver import LocalRedis
from tests.history.buscallers import Loss
from tests.history.redisgroup import SentinelRedis

#: how long the master's writes are held before its kill (it dies long before)
PAUSE_MS = 5000
#: the data nodes' replication ping period: no pings in a history
PING_PERIOD_S = 3600
#: the Sentinels' failure detection (the chain's 1 s failed a newly promoted master over
#: again by itself on a loaded machine: no PING answered within 1 s of the switch)
NODE_TIMEOUT_MS = 2000

TwinRedis = LocalRedis | SentinelRedis


def start_twin_redis(directory: Path, *, sentinel: bool) -> TwinRedis:
    """The twin's Redis, started in ``directory``."""
    if sentinel:
        group = SentinelRedis(directory, node_timeout_ms=NODE_TIMEOUT_MS)
        group.start()
        _no_pings(group)
        return group
    return LocalRedis(directory, aof=True).start()


def env_of(twin_redis: TwinRedis) -> dict[str, str]:
    """What a ``sluice bus`` of the twin gets beside the URL."""
    return twin_redis.env() if isinstance(twin_redis, SentinelRedis) else {}


def _no_pings(group: SentinelRedis) -> None:
    """No replication pings (a ping is bytes of the stream, not data; the buses write every
    fraction of a second, so no replica times out for want of them)."""
    for server in group.group.data:
        client = server.client()
        try:
            client.config_set("repl-ping-replica-period", PING_PERIOD_S)
        finally:
            client.close()


def _cut_replica(master: redis.Redis) -> None:
    """No new connection to ``master`` (its replica's included), then its replica's link
    dropped; the master dies before it takes connections again."""
    master.config_set("maxclients", int(master.info("clients")["connected_clients"]) - 1)
    master.execute_command("CLIENT", "KILL", "TYPE", "replica")


def _last_offset(master: redis.Redis) -> tuple[str, int]:
    """Hold the master's writes, then its replication id and offset (final until it dies)."""
    master.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    info = master.info("replication")
    return str(info["master_replid"]), int(info["master_repl_offset"])


def _held_by_promoted(group: SentinelRedis, replid: str) -> int:
    """The last byte of the old master's stream (``replid``) the promoted replica held."""
    master = group.group.master()
    info = master.client().info("replication")
    if str(info.get("master_replid2")) != replid:
        raise RuntimeError(
            f"the Sentinels failed over again by themselves (the master on {master.port} does "
            "not continue the killed master's stream): a split brain whose losses cannot be "
            "bounded; this history cannot be judged"
        )
    return int(info["second_repl_offset"]) - 1


async def failover(group: SentinelRedis, rng: random.Random) -> tuple[str, Loss | None]:
    """The master killed -9 (after a fence; its replica's link dropped first if ``lag`` is
    drawn), the group whole again; what happened and what it provably lost (module doc)."""
    lag = rng.random() < 0.5
    loop = asyncio.get_running_loop()
    kept, wall_kept = loop.time(), time.time()
    await asyncio.to_thread(group.fence)
    master = group.group.master().client()
    if lag:
        await asyncio.to_thread(_cut_replica, master)
        await asyncio.sleep(rng.uniform(0.05, 0.6))
    replid, offset = await asyncio.to_thread(_last_offset, master)
    master.close()
    text = await group.failover(rng)
    await asyncio.to_thread(_no_pings, group)  # the old master came back with its own
    held = await asyncio.to_thread(_held_by_promoted, group, replid)
    lost = offset - held
    text += f"{', the replica cut off first' if lag else ''}; lost {lost} bytes of writes"
    if lost <= 0:
        return text, None
    wall_end = time.time() - (time.monotonic() - group.promoted_at)
    return text, Loss(kept, wall_kept, group.promoted_at, wall_end, partial=True)


def promoted_wall(group: SentinelRedis) -> float:
    """When the last failover's replica was promoted, in ``time.time()``."""
    return time.time() - (time.monotonic() - group.promoted_at)


async def flushall(twin_redis: TwinRedis) -> None:
    """FLUSHALL on the twin's Redis (on Sentinel: its master's)."""
    if isinstance(twin_redis, SentinelRedis):
        await asyncio.to_thread(twin_redis.client.flushall)
        return
    client = redis.Redis.from_url(twin_redis.url)
    try:
        await asyncio.to_thread(client.flushall)
    finally:
        client.close()


__all__ = [
    "NODE_TIMEOUT_MS",
    "PAUSE_MS",
    "TwinRedis",
    "env_of",
    "failover",
    "flushall",
    "start_twin_redis",
]
