"""The nemesis: real faults on real processes and links.

- ``kill_serve``: ``kill -9`` of ``sluice serve``, started again on its port; in
  about a third of them (:data:`SECOND_SERVE`, drawn from a stream of the seed's
  own, so every seed keeps the schedule it always drew) a second serve process
  takes the consumers instead, as behind a load balancer: it is started on a
  port of its own the first time, the consumers' link is pointed at it, and
  the killed one is started again, idle, for the next such failover (each
  instance has its own tail index, lake reader and fork choice state: a
  subscriber resumes on one that never served it);
- ``pause_serve``: SIGSTOP, then SIGCONT after a while;
- ``restart_redis``: Redis shut down and started again on its port and data
  (appendonly, fsync always: nothing written is lost);
- ``redis_link`` and ``client_link``: Toxiproxy between serve and Redis, and
  between the consumers and serve: a cut connection, latency, a half-open
  connection (data stops, the connection stays), a slow one;
- ``failover`` (only in a history on a Sentinel group, where it replaces
  ``restart_redis`` and ``redis_link``: serve's link then follows the master
  and goes through no proxy): ``kill -9`` of the master, the replica promoted,
  the old master back as a replica, the group whole
  (:meth:`tests.history.redisgroup.SentinelRedis.failover`).

Every fault heals before the next step; :meth:`Nemesis.heal` ends whatever is left.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

import psutil

from pipeline.runtime.ports import free_port
from tests.history.harness import LINK_FAULTS, heal_link, link_fault
from tests.history.redisgroup import RedisOfHistory, SentinelRedis
from tests.integration.chain.test_cardinal_go import _listening as listening
from tests.support.toxiproxy import Proxy

#: the faults of a history on one Redis server (its seeds replay with these, in this order)
FAULTS = ("kill_serve", "pause_serve", "restart_redis", "redis_link", "client_link")
#: the faults of a history on a Sentinel group
SENTINEL_FAULTS = ("kill_serve", "pause_serve", "client_link", "failover")
#: Of the ``kill_serve`` faults, the share where a second serve process takes the consumers.
SECOND_SERVE = 0.35


class Serve:
    """``sluice serve`` in its own process on a fixed port."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.env = env
        self.port = port
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pipeline.cli", "serve", "--port", str(self.port),
                env=self.env, stdout=out, stderr=out,
            )  # fmt: skip
        self.starts += 1
        await self._listening(self.proc)

    async def _listening(self, proc: asyncio.subprocess.Process) -> None:
        """Until ``proc`` itself listens on the port; one line if it exits first or takes 60 s.

        A connection that succeeds is not enough: with many histories on the machine,
        another process may hold the port, and serve then exits "cannot listen".
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not _listens(proc.pid, self.port):
            if proc.returncode is not None or loop.time() > deadline:
                lines = self.log.read_text(errors="replace").strip().splitlines()
                why = f"exit {proc.returncode}" if proc.returncode is not None else "60 s"
                raise RuntimeError(
                    f"serve never started on :{self.port} ({why}): "
                    f"{lines[-1] if lines else 'no output'}; its log: {self.log}"
                )
            await asyncio.sleep(0.05)
        await listening(self.port, 10)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            async with asyncio.timeout(15):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a listening TCP socket on ``port``."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


class Nemesis:
    """Draws and applies one fault at a time (see the module doc)."""

    def __init__(
        self, rng: random.Random, serve: Serve, redis: RedisOfHistory, redis_link: Proxy | None,
        client_link: Proxy, second: Serve | None = None, seed: int = 0,
    ) -> None:  # fmt: skip
        self.rng = rng
        #: the serve process behind the consumers' link, and the other one (None: one only)
        self.serve = serve
        self.second = second
        #: whether a kill_serve hands the consumers to the second process: the seed's own draws
        self.second_draws = random.Random(f"second-serve-{seed}")
        self.switches = 0
        self.redis = redis
        self.links = {"client_link": client_link}
        if redis_link is not None:
            self.links["redis_link"] = redis_link
        self.done: list[str] = []

    @property
    def faults(self) -> tuple[str, ...]:
        """The fault kinds this history's Redis allows."""
        return SENTINEL_FAULTS if isinstance(self.redis, SentinelRedis) else FAULTS

    async def strike(self, fault: str) -> str:
        """Apply ``fault`` and heal it; returns what was done, for the report."""
        rng = self.rng
        if fault == "kill_serve":
            before, after = rng.uniform(0, 0.5), rng.uniform(0, 1)  # (drawn as always)
            await asyncio.sleep(before)
            if self.second is not None and self.second_draws.random() < SECOND_SERVE:
                what = await self._to_second(after)
            else:
                await self.serve.kill()
                await asyncio.sleep(after)
                await self.serve.start()
                what = fault
        elif fault == "pause_serve":
            assert self.serve.proc is not None
            pause = rng.uniform(0.3, 3)
            os.kill(self.serve.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(pause)
            os.kill(self.serve.proc.pid, signal.SIGCONT)
            what = f"{fault} {pause:.1f}s"
        elif fault == "restart_redis":
            assert not isinstance(self.redis, SentinelRedis), "no restart_redis on Sentinel"
            what = await self.redis.restart(rng)
        elif fault == "failover":
            assert isinstance(self.redis, SentinelRedis), "a failover needs a Sentinel group"
            what = await self.redis.failover(rng)
        else:
            what = await self._link(fault, self.links[fault])
        self.done.append(what)
        return what

    async def _to_second(self, after: float) -> str:
        """``kill -9`` of the serve process behind the consumers, who go to the other one."""
        old, new = self.serve, self.second
        assert new is not None
        if new.proc is None:
            new.port = free_port()  # chosen now: a port chosen long before may be taken
        if new.proc is None or new.proc.returncode is not None:
            await new.start()
        await old.kill()
        await asyncio.to_thread(self.links["client_link"].point, new.port)
        await asyncio.sleep(after)
        await old.start()  # back, idle, for the next failover
        self.serve, self.second = new, old
        self.switches += 1
        return f"kill_serve, the consumers to the other serve (:{new.port})"

    async def stop_serves(self) -> None:
        """Stop every serve process of the history."""
        for serve in (self.serve, self.second):
            if serve is not None:
                await serve.stop()

    async def _link(self, fault: str, proxy: Proxy) -> str:
        return f"{fault} {await link_fault(self.rng, proxy, LINK_FAULTS)}"

    async def heal(self) -> None:
        for proxy in self.links.values():
            await heal_link(proxy)
        if self.serve.proc is not None and self.serve.proc.returncode is None:
            os.kill(self.serve.proc.pid, signal.SIGCONT)


__all__ = ["FAULTS", "SECOND_SERVE", "SENTINEL_FAULTS", "Nemesis", "Serve", "listening"]
