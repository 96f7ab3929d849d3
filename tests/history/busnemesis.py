"""The bus's nemesis: real faults on the twins' buses, Redis servers and the link between them.

- ``kill_sender`` / ``kill_receiver``: ``kill -9`` of the twin's ``sluice bus``,
  started again after up to 1 s; with a standby, of its active bus (found by
  ``/healthz``'s ``role``): the time until the standby says it is active is
  reported, and the killed bus is started again (as the standby) after up to
  the lease;
- ``kill_standby_sender`` / ``kill_standby_receiver`` (with standbys):
  ``kill -9`` of the twin's standby bus, started again after up to 1 s;
- ``pause_sender`` / ``pause_receiver``: SIGSTOP of the twin's active bus for
  0.3 to 6 s (past its lease, past many calls' ``exp``), then SIGCONT;
- ``link_requests`` / ``link_replies``: Toxiproxy on the link to the receiver
  (the requests' POSTs and their responses) or to the sender (the replies'):
  a cut, latency, a half-open connection, a slow one, or reset connections;
- ``restart_redis_sender`` / ``restart_redis_receiver``: the twin's Redis
  killed -9 or stopped, then started again on its files (appendonly, fsync
  always: nothing is lost);
- ``wipe_redis_sender`` / ``wipe_redis_receiver``: the Redis killed -9 and its
  files deleted: it starts again empty (a restart without persistence);
- ``flushall_receiver``: FLUSHALL on the receiver's Redis;
- ``failover_sender`` / ``failover_receiver`` (on Sentinel, instead of the
  restarts and wipes): ``kill -9`` of the twin's master, its replica promoted,
  the group whole again; a loss only when provably lost
  (:func:`tests.history.busredis.failover`).

Every fault heals before the next step; :meth:`BusNemesis.heal` ends whatever
is left. Data losses are recorded on the twin (:attr:`Twin.losses`) for the
checker.
"""

from __future__ import annotations

import asyncio
import random
import time

from pipeline.local.redisserver import LocalRedis
from tests.history import busredis
from tests.history.buscallers import Loss
from tests.history.busprocs import LEASE_S, BusProc, Twin, wipe
from tests.history.harness import heal_link, link_fault

FAULTS = (
    "kill_sender", "kill_receiver", "pause_sender", "pause_receiver", "link_requests",
    "link_replies", "restart_redis_sender", "restart_redis_receiver", "wipe_redis_sender",
    "wipe_redis_receiver", "flushall_receiver",
)  # fmt: skip
#: with standbys, besides :data:`FAULTS`
STANDBY_FAULTS = ("kill_standby_sender", "kill_standby_receiver")
#: on Sentinel, instead of the Redis restarts and wipes
SENTINEL_FAULTS = ("failover_sender", "failover_receiver")
LINK_KINDS = ("cut", "latency", "half_open", "slow", "reset_peer")


class BusNemesis:
    """Draws and applies one fault at a time (see the module doc)."""

    def __init__(self, rng: random.Random, sender: Twin, receiver: Twin) -> None:
        self.rng = rng
        self.twins = {"sender": sender, "receiver": receiver}
        self._loop = asyncio.get_running_loop()

    async def strike(self, fault: str) -> str:
        """Apply ``fault`` and heal it; what was done, for the report.

        ``AssertionError`` when a bus process exited by itself since the last fault: a
        crash the checker reports as such (not a fault it could apply)."""
        crashed = [d for t in self.twins.values() for p in t.procs if (d := p.died())]
        assert not crashed, "; ".join(crashed)
        action, _, side = fault.rpartition("_")
        twin = self.twins[{"requests": "receiver", "replies": "sender"}.get(side, side)]
        if action == "kill":
            return f"{fault} {await self._kill(twin)}"
        if action == "kill_standby":
            return f"{fault} {await self._kill_standby(twin)}"
        if action == "failover":
            assert isinstance(twin.redis, busredis.SentinelRedis)
            began = time.time()
            text, loss = await busredis.failover(twin.redis, self.rng)
            twin.outages.append((began, busredis.promoted_wall(twin.redis)))
            if loss is not None:
                twin.losses.append(loss)
            return f"{fault} {text}"
        if action == "pause":
            return f"{fault} {await self._pause(twin)}"
        if action == "link":  # the link to the twin: its requests' or its replies' POSTs
            assert twin.link is not None
            return f"{fault} {await link_fault(self.rng, twin.link, LINK_KINDS)}"
        if action == "restart_redis":
            assert isinstance(twin.redis, LocalRedis)
            how = self.rng.choice(["kill", "stop"])
            await asyncio.to_thread(twin.redis.kill if how == "kill" else twin.redis.stop)
            await asyncio.sleep(self.rng.uniform(0, 1.5))
            await asyncio.to_thread(twin.redis.start)
            return f"{fault} ({how})"
        if action == "wipe_redis":
            assert isinstance(twin.redis, LocalRedis)
            loss = self._losing(twin)
            await asyncio.to_thread(wipe, twin.redis)
            loss.end, loss.wall_end = self._loop.time(), time.time()
            return fault
        if action == "flushall":
            loss = self._losing(twin)
            await busredis.flushall(twin.redis)
            loss.end, loss.wall_end = self._loop.time(), time.time()
            return fault
        raise ValueError(f"unknown fault {fault!r}")

    def _losing(self, twin: Twin) -> Loss:
        twin.losses.append(Loss(self._loop.time(), time.time()))
        return twin.losses[-1]

    def _running(self, twin: Twin) -> list[BusProc]:
        return [p for p in twin.procs if p.running]

    async def _with_role(self, twin: Twin, role: str) -> BusProc | None:
        for proc in self._running(twin):
            if await proc.role() == role:
                return proc
        return None

    async def _active(self, twin: Twin) -> BusProc | None:
        return await self._with_role(twin, "active")

    async def _settled(self, twin: Twin, limit_s: float) -> None:
        """Until one process of ``twin`` says it is active and every other one the standby
        (after a pause or a failover, the old one says active until it notices)."""
        began = self._loop.time()
        while self._loop.time() - began < limit_s:
            roles = [await p.role() for p in self._running(twin)]
            if roles.count("active") == 1 and roles.count("standby") == len(roles) - 1:
                return
            await asyncio.sleep(0.1)

    async def _role_after(self, twin: Twin, role: str, limit_s: float) -> float | None:
        """Seconds until a process of ``twin`` says it is ``role`` (None: not in ``limit_s``)."""
        began = self._loop.time()
        while self._loop.time() - began < limit_s:
            if await self._with_role(twin, role) is not None:
                return self._loop.time() - began
            await asyncio.sleep(0.1)
        return None

    async def _kill(self, twin: Twin) -> str:
        await asyncio.sleep(self.rng.uniform(0, 0.5))
        if len(twin.procs) > 1:
            return await self._kill_active(twin)
        victim = self.rng.choice(self._running(twin))  # one: drawn as it always was
        await victim.kill()
        await asyncio.sleep(self.rng.uniform(0, 1))
        await victim.start()
        return victim.name

    async def _kill_standby(self, twin: Twin) -> str:
        await asyncio.sleep(self.rng.uniform(0, 0.5))
        await self._settled(twin, LEASE_S + 3)
        victim = await self._with_role(twin, "standby")
        if victim is None:
            return "no process said it was the standby: nothing killed"
        await victim.kill()
        await asyncio.sleep(self.rng.uniform(0, 1))
        await victim.start()
        return f"killed the standby {victim.name}"

    async def _pause(self, twin: Twin) -> str:
        victim = await self._active(twin) or self._running(twin)[0]
        pause = self.rng.uniform(0.3, 6)
        victim.pause()
        await asyncio.sleep(pause)
        victim.resume()
        return f"{victim.name} {pause:.1f}s"

    async def _kill_active(self, twin: Twin) -> str:
        await self._settled(twin, LEASE_S + 3)
        victim = await self._active(twin)
        if victim is None:
            return "no process said it was active: nothing killed"
        await victim.kill()
        killed = self._loop.time()
        took = await self._role_after(twin, "active", LEASE_S + 10)
        await asyncio.sleep(self.rng.uniform(0, LEASE_S))
        await victim.start()
        after = "no takeover" if took is None else f"another active after {took:.1f}s"
        return f"killed the active {victim.name}: {after} (killed at {killed:.1f})"

    async def heal(self) -> None:
        for twin in self.twins.values():
            if twin.link is not None:
                await heal_link(twin.link)
            single = isinstance(twin.redis, LocalRedis)
            if single and (twin.redis.proc is None or twin.redis.proc.poll() is not None):
                await asyncio.to_thread(twin.redis.start)
            for proc in twin.procs:
                proc.resume()
            if not self._running(twin) and twin.procs:
                await twin.procs[0].start()


__all__ = ["FAULTS", "LINK_KINDS", "SENTINEL_FAULTS", "STANDBY_FAULTS", "BusNemesis"]
