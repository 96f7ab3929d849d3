"""The bus on Redis beyond one server: it runs on Sentinel (and follows a failover) and
refuses a cluster URL in one line (docs/DESIGN.md, "The bus on more than one Redis")."""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import time
from typing import Any

import pytest
from redis.exceptions import RedisError

from pipeline.bus.config import CLUSTER_REFUSAL
from pipeline.bus.directory import FileDirectory
from pipeline.bus.process import BusProcess
from pipeline.errors import ConfigError, SluiceError
from pipeline.redisio.durability import Durability
from tests.support.poll import until

from .conftest import ROOT, Twin
from .test_process import echo, serve, stop

pytestmark = pytest.mark.timeout(180)


class SentinelTwin(Twin):
    """A twin whose Redis is the session's Sentinel group (the URL, not one server)."""

    sentinel_url: str = ""

    @property
    def url(self) -> str:
        return self.sentinel_url


def on_sentinel(twin: Twin, url: str) -> Twin:
    twin.__class__ = SentinelTwin
    twin.sentinel_url = url  # type: ignore[attr-defined]
    return twin


async def test_call_between_a_sentinel_twin_and_a_single_one(twins: Any, sentinel_url: str) -> None:
    a, b = twins(2)
    on_sentinel(a, sentinel_url)
    await a.start_bus()
    await b.start_bus()
    tasks = [serve(t, echo=echo)[1] for t in (a, b)]
    try:
        assert await a.client().call("echo", dst=[b.id, a.id], data="x") == [b"echo:x"] * 2
        assert await b.client().call("echo", dst=[a.id], data="y") == [b"echo:y"]
    finally:
        for task in tasks:
            await stop(task)


async def test_bus_calls_survive_the_masters_death(
    twins: Any, redis_sentinels: Any, sentinel_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Calls at concurrency 20 from a twin on Sentinel to itself, master killed with SIGKILL:
    the bus goes on, calls after the failover all succeed, and the counts are reported."""
    (a,) = twins(1)
    on_sentinel(a, sentinel_url)
    await a.start_bus()
    _, task = serve(a, echo=echo)
    client = a.client()
    outcome: collections.Counter[str] = collections.Counter()
    stop_at: list[float] = []

    async def caller(n: int) -> None:
        i = 0
        while not stop_at:
            i += 1
            data = f"{n}:{i}"
            try:
                got = await client.call("echo", dst=[a.id], data=data, exp=15, wait_s=20)
            except (SluiceError, RedisError, OSError) as exc:  # counted by kind, not hidden
                outcome[f"failed:{type(exc).__name__}:{str(exc)[:60]}"] += 1
            else:
                outcome["ok" if got == [f"echo:{data}".encode()] else "wrong"] += 1

    callers = [asyncio.create_task(caller(n)) for n in range(20)]
    try:
        await until(lambda: outcome["ok"] >= 200, "200 calls before the kill", within_s=60)
        killed_at = time.monotonic()
        dead = redis_sentinels.kill_master()
        await asyncio.to_thread(redis_sentinels.wait_failed_over, dead)
        ok_at_failover = outcome["ok"]
        await until(
            lambda: outcome["ok"] >= ok_at_failover + 200,
            "200 calls after the failover",
            within_s=90,
            detail=lambda: dict(outcome),
        )
        recovered_s = time.monotonic() - killed_at
        stop_at.append(time.monotonic())
        await asyncio.gather(*callers)
        assert a.bus is not None
        failing = asyncio.ensure_future(a.bus.wait())  # ends only if a bus task failed
        done, _ = await asyncio.wait({failing}, timeout=0.2)
        failing.cancel()
        assert not done, "a task of the bus failed"
        assert outcome["wrong"] == 0
        with capsys.disabled():
            print(  # noqa: T201 - the counts are the test's report
                f"\nbus failover (sentinel): {dict(outcome)} recovered_in={recovered_s:.1f}s"
            )
    finally:
        stop_at.append(time.monotonic())
        await asyncio.gather(*callers, return_exceptions=True)
        await stop(task)
        await asyncio.to_thread(redis_sentinels.heal)


async def test_requests_leave_once_a_replica_holds_their_backlog(
    twins: Any, redis_sentinels: Any, sentinel_url: str
) -> None:
    """SLUICE_REDIS_MIN_REPLICAS=1 on Sentinel: each batch of requests is followed by a WAIT
    that a replica answers before the requests go on; none is counted as not replicated."""
    (a,) = twins(1)
    on_sentinel(a, sentinel_url)
    master = redis_sentinels.master().client()
    try:
        waits_before = _wait_calls(master)
        bus = await a.start_bus(durability=Durability(1, 5000))
        _, task = serve(a, echo=echo)
        try:
            for i in range(5):
                assert await a.client().call("echo", dst=[a.id], data=str(i)) == [
                    f"echo:{i}".encode()
                ]
        finally:
            await stop(task)
        assert _wait_calls(master) >= waits_before + 5  # at least one WAIT per call's batch
        assert bus.queues.not_replicated == 0
    finally:
        master.close()


async def test_requests_no_replica_took_are_counted(twins: Any) -> None:
    """One server with no replica, WAIT 1: calls are still answered (the master holds their
    backlog), and every request that left unreplicated is counted."""
    (a,) = twins(1)
    bus = await a.start_bus(durability=Durability(1, 50))
    _, task = serve(a, echo=echo)
    try:
        assert await a.client().call("echo", dst=[a.id], data="x") == [b"echo:x"]
    finally:
        await stop(task)
    # counted once its WAIT timed out (the answer to a request to itself may come first)
    await until(lambda: bus.queues.not_replicated >= 1, "the request counted", within_s=30)


def _wait_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


async def test_bus_refuses_a_cluster_url(twins: Any) -> None:
    (a,) = twins(1)
    with pytest.raises(ConfigError, match="use redis\\+sentinel://") as info:
        BusProcess(
            a.config(),
            redis_url="redis+cluster://127.0.0.1:7000",
            directory=FileDirectory.load(a.directory_file),
            signer=a.signer,
        )
    assert str(info.value) == CLUSTER_REFUSAL and "\n" not in CLUSTER_REFUSAL


def test_sluice_bus_refuses_a_cluster_url_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "bus", "--twin", "1", "--redis",
         "redis+cluster://127.0.0.1:7000"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"sluice bus: {CLUSTER_REFUSAL}"]
