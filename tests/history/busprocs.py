"""The processes of a bus history: two twins, each with its own Redis and ``sluice bus``.

The sending twin (:data:`SENDER`) and the receiving twin (:data:`RECEIVER`)
each have a ``redis-server`` (appendonly, fsync always: a restart loses
nothing unless the nemesis deletes its files) or a Sentinel group of its own
(:mod:`tests.history.busredis`), a key pair, and one ``sluice bus`` process
(two when the seed draws standbys: :class:`BusProc` per process). The
buses reach each other only through Toxiproxy: the twin directory names each
twin by its proxy's port, so every POST between them crosses a link the
nemesis can cut, slow or hold half-open. The handler of the receiving twin runs
in its own process (:mod:`tests.history.bushandler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from pipeline.bus.signing import Signer
from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port
from pipeline.settings.bus import BusSettings
from tests.history.buscallers import Loss
from tests.history.busredis import TwinRedis, env_of, start_twin_redis
from tests.support.toxiproxy import Proxy, Toxiproxy

ROOT = Path(__file__).resolve().parents[2]
SENDER = 1001
RECEIVER = 1002
#: The twins' lease TTL in these histories (the bus's default is 4 s): a bus
#: restarted after kill -9 waits this long at most for its dead self's lease.
LEASE_S = 2.0
#: How long a process may take to say it is up (a loaded machine is slow).
START_S = 90.0


def bus_env(workdir: Path, health_port: int | None) -> dict[str, str]:
    """The environment of a ``sluice bus`` of a history (nothing of the caller's SLUICE_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.pop("PYTHONASYNCIODEBUG", None)
    env.update(
        SLUICE_BUS_RETRY_BASE_S="0.05",
        SLUICE_BUS_RETRY_MAX_S="0.5",
        SLUICE_LOG_LEVEL=os.environ.get("CHECKER_BUS_LOG", "INFO"),
        SLUICE_CONFIG=os.devnull,
        SLUICE_VAR_DIR=str(workdir / "var"),
    )
    if "twin_lease_s" in {f.name for f in dataclasses.fields(BusSettings)}:
        env["SLUICE_BUS_TWIN_LEASE_S"] = str(LEASE_S)
    if health_port is not None:
        env["SLUICE_BUS_HEALTH_LISTEN"] = f"127.0.0.1:{health_port}"
    return env


async def _started(proc: asyncio.subprocess.Process, log: Path, text: str, what: str) -> None:
    """Wait until ``text`` is in ``log`` (the process's output); raise if it exits first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_S
    while text not in (out := await asyncio.to_thread(log.read_text, errors="replace")):
        if proc.returncode is not None or loop.time() > deadline:
            raise RuntimeError(f"{what} did not start (exit {proc.returncode}): {out[-2000:]}")
        await asyncio.sleep(0.05)


@dataclass
class Twin:
    """One twin: its Redis, its bus's port, its key, the link peers reach it through."""

    id: int
    redis: TwinRedis
    port: int
    key_file: Path
    signer: Signer
    link: Proxy | None = None
    procs: list[BusProc] = field(default_factory=list)
    #: when this twin's Redis lost its data
    losses: list[Loss] = field(default_factory=list)
    #: (start, end) in ``time.time()`` of each failover of the twin's Redis: no master
    #: took writes from the kill until the promotion (nothing can be answered meanwhile)
    outages: list[tuple[float, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "sender" if self.id == SENDER else "receiver"


class BusProc:
    """One ``sluice bus`` process of a twin (a standby listens on the same port)."""

    def __init__(self, twin: Twin, directory: Path, workdir: Path, name: str, *,
                 health: bool) -> None:  # fmt: skip
        self.twin = twin
        self.directory = directory
        self.workdir = workdir
        self.name = name
        self.health_port = free_port() if health else None
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.paused = False
        #: the log of its current start
        self.log: Path | None = None
        #: the nemesis or the run ended this start (a kill or a stop)
        self.ended = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def died(self) -> str | None:
        """How this bus ended without a kill or stop of the run's (a crash), else None."""
        if self.proc is None or self.proc.returncode is None or self.ended:
            return None
        return f"bus {self.twin.name}/{self.name} exited by itself ({self.proc.returncode}); its log: {self.log}"

    async def start(self) -> None:
        t = self.twin
        self.starts += 1
        self.ended = False
        log = self.log = self.workdir / f"bus-{t.name}-{self.name}-{self.starts}.log"
        with log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pipeline.cli", "bus", "--twin", str(t.id),
                "--listen", f"127.0.0.1:{t.port}", "--directory", str(self.directory),
                "--key", str(t.key_file), "--redis", t.redis.url,
                env=bus_env(self.workdir, self.health_port) | env_of(t.redis), stdout=out,
                stderr=out, cwd=ROOT,
            )  # fmt: skip
        await _started(self.proc, log, "listening on", f"bus {t.name}/{self.name}")

    async def kill(self) -> None:
        self.ended = True
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            await self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.running and self.paused:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    async def stop(self) -> None:
        self.ended = True
        if not self.running:
            return
        assert self.proc is not None
        self.resume()
        self.proc.terminate()
        try:
            async with asyncio.timeout(15):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    async def role(self) -> str:
        """``active`` or ``standby`` as its ``/healthz`` says ("" if it does not answer)."""
        if self.health_port is None or not self.running or self.paused:
            return ""
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session,
                session.get(url) as resp,
            ):
                return str((await resp.json()).get("role", ""))
        return ""


class HandlerProc:
    """The receiving twin's handler (:mod:`tests.history.bushandler`) in its own process."""

    def __init__(self, redis_url: str, log: Path, out: Path) -> None:
        self.redis_url = redis_url
        self.log = log
        self.out = out
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.pop("PYTHONASYNCIODEBUG", None)
        with self.out.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.history.bushandler", "--redis", self.redis_url,
                "--log", str(self.log), env=env, stdout=out, stderr=out, cwd=ROOT,
            )  # fmt: skip
        await _started(self.proc, self.out, "handler serving", "the handler")

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            async with asyncio.timeout(15):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def make_twins(workdir: Path, toxiproxy: Toxiproxy, tag: str, *,
               sentinel: bool = False) -> tuple[Twin, Twin, Path]:  # fmt: skip
    """The sender and the receiver (Redis started, links made) and their directory file."""
    twins = []
    for twin_id in (SENDER, RECEIVER):
        signer = Signer.generate()
        key_file = workdir / f"twin{twin_id}.key"
        signer.write(key_file)
        where = workdir / f"{'sentinel' if sentinel else 'redis'}-{twin_id}"
        redis = start_twin_redis(where, sentinel=sentinel)
        twin = Twin(twin_id, redis, free_port(), key_file, signer)
        twin.link = toxiproxy.proxy(f"bus-{tag}-{twin_id}", twin.port)
        twins.append(twin)
    directory = workdir / "twins.json"
    doc = {
        str(t.id): {"url": f"http://127.0.0.1:{t.link.port}", "key": t.signer.public_key}
        for t in twins
        if t.link is not None
    }
    directory.write_text(json.dumps(doc))
    return twins[0], twins[1], directory


def wipe(redis: LocalRedis) -> None:
    """Kill -9 ``redis`` and delete its files: it starts again empty (a restart without
    persistence)."""
    redis.kill()
    for path in redis.directory.iterdir():
        if path.name == "appendonlydir":
            for part in path.iterdir():
                part.unlink()
        elif path.suffix in (".rdb", ".aof"):
            path.unlink()
    redis.start()


__all__ = [
    "LEASE_S",
    "RECEIVER",
    "SENDER",
    "BusProc",
    "HandlerProc",
    "Twin",
    "bus_env",
    "make_twins",
    "wipe",
]
