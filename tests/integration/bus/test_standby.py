"""One active bus per twin, with a hot standby (issue 31, item 1), on real ``sluice bus``
processes: a second bus of a twin stands by and resends nothing; kill -9 of the active
under calls, and an active frozen past its lease, hand the work over exactly once (the
handler's own log of executions is the judge)."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import lease
from pipeline.bus.envelope import Envelope
from pipeline.runtime.ports import free_port

from .conftest import ROOT, Twin, eventually
from .test_process import seed_request, serve, stop

pytestmark = pytest.mark.timeout(120)
log = logging.getLogger(__name__)

#: The lease TTL of these tests' buses (the default is 4 s).
TTL_S = 2.0


class Bus:
    """One ``sluice bus`` child process of a twin, on the twin's own host:port."""

    def __init__(self, twin: Twin, name: str) -> None:
        self.twin = twin
        self.log_file = twin.key_file.with_name(f"{twin.id}-{name}.log")
        self.health = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Bus:
        env = {
            **os.environ,
            "SLUICE_BUS_RETRY_BASE_S": "0.05",
            "SLUICE_BUS_RETRY_MAX_S": "0.5",
            "SLUICE_BUS_TWIN_LEASE_S": str(TTL_S),
            "SLUICE_BUS_HEALTH_LISTEN": f"127.0.0.1:{self.health}",
            "SLUICE_LOG_LEVEL": "INFO",
        }
        env.pop("PYTHONASYNCIODEBUG", None)
        t = self.twin
        args = [
            sys.executable, "-m", "pipeline.cli", "bus", "--twin", str(t.id),
            "--listen", f"127.0.0.1:{t.port}", "--directory", str(t.directory_file),
            "--key", str(t.key_file), "--redis", t.url,
        ]  # fmt: skip
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=log, cwd=ROOT, env=env
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.proc.stdout.close()
        assert b"listening" in line, self.log()
        return self

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig is signal.SIGKILL:
            self.proc.wait(10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    async def healthz(self) -> dict[str, Any]:
        """``/healthz`` (it starts serving just after the "listening" line)."""
        for _ in range(50):
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{self.health}/healthz") as resp,
                ):
                    return dict(await resp.json())
            except aiohttp.ClientConnectorError:
                await asyncio.sleep(0.1)
        raise AssertionError(f"no /healthz: {self.log()[-2000:]}")

    async def role(self) -> str:
        return str((await self.healthz()).get("role"))


def started_buses() -> Iterator[Callable[[Twin, str], Bus]]:
    """Starts ``sluice bus`` processes (``make(twin, name)``); kills them at the end."""
    made: list[Bus] = []

    def make(twin: Twin, name: str) -> Bus:
        made.append(Bus(twin, name).start())
        return made[-1]

    yield make
    for bus in made:
        bus.close()


@pytest.fixture
def buses() -> Iterator[Callable[[Twin, str], Bus]]:
    yield from started_buses()


class Handler:
    """Twin b's handler of ``work``: logs each execution (request uid, call data)."""

    def __init__(self, hold_after: int = 1 << 30) -> None:
        self.executions: list[tuple[str, bytes]] = []
        #: Executions past ``hold_after`` wait for this before answering (work in flight).
        self.released = asyncio.Event()
        self._hold_after = hold_after

    async def work(self, data: bytes, request: Envelope) -> bytes:
        self.executions.append((request.uid, data))
        if len(self.executions) > self._hold_after:
            await self.released.wait()
        await asyncio.sleep(0.002)
        return b"done:" + data

    def per_call(self) -> collections.Counter[bytes]:
        return collections.Counter(data for _, data in self.executions)


async def _answers(client: aioredis.Redis, rets: list[str], wait: float) -> dict[str, Any]:
    """One answer per ret (within ``wait``), then proof that no second one came."""
    answers: dict[str, Any] = {}
    deadline = time.monotonic() + wait
    pending = set(rets)
    while pending and time.monotonic() < deadline:
        popped = await client.blpop(list(pending)[:200], timeout=1)
        if popped is not None:
            answers[popped[0].decode()] = json.loads(popped[1])
            pending.discard(popped[0].decode())
    if pending:  # where they are, for the failure's captured log
        log.warning("%d calls unanswered; the caller's twin holds %s", len(pending),
                    await _holdings(client))  # fmt: skip
    await asyncio.sleep(1.0)
    extra = sum([await client.llen(r) for r in rets])
    assert extra == 0, f"{extra} calls answered twice"
    return answers


async def _holdings(client: aioredis.Redis) -> dict[str, int]:
    """The sizes of the bus's lists, backlog and expiry set in a twin's Redis."""
    out: dict[str, int] = {}
    async for raw in client.scan_iter(match="msgbus.system.*"):
        name = raw.decode()
        kind = (await client.type(name)).decode()
        size = {"list": client.llen, "hash": client.hlen, "zset": client.zcard}.get(kind)
        if size is not None:
            out[name] = int(await size(name))
    return out


async def test_a_second_bus_of_a_twin_stands_by_and_resends_nothing(twins, buses):
    a, b = twins(2)
    b.spawn()
    first = buses(a, "first")
    ra = aioredis.Redis.from_url(a.url)
    rb = aioredis.Redis.from_url(b.url)
    handler = Handler()
    task = None
    try:
        # b's handler is not running yet: 18 requests wait in a's backlog, delivered to b
        docs = [seed_request("work", [b.id], str(i).encode(), exp=60) for i in range(18)]
        await ra.rpush(keys.BUS_LOCAL, *[json.dumps(d) for d in docs])

        async def delivered() -> bool:
            return await rb.llen("msgbus.work") == 18

        await eventually(delivered)
        second = buses(a, "second")
        await asyncio.sleep(1.0)  # what it does first
        assert "resending" not in second.log()  # the finding: it resent a's 18 requests
        owner = (await first.healthz())["active"]
        assert await first.role() == "active"
        health = await second.healthz()
        assert health["role"] == "standby" and health["active"] == owner
        assert health["status"] == "ok"  # a standby is healthy (it serves HTTP)
        standby_lines = [ln for ln in second.log().splitlines() if "standby" in ln]
        assert len(standby_lines) == 1, second.log()
        assert f"standby for twin {a.id}: the active bus is {owner}" in standby_lines[0]

        _, task = serve(b, work=handler.work)
        answers = await _answers(ra, [d["ret"] for d in docs], wait=20)
    finally:
        if task is not None:
            await stop(task)
        await ra.aclose()
        await rb.aclose()
    assert len(answers) == 18 and all(not ans["err"] for ans in answers.values())
    assert set(handler.per_call().values()) == {1} and len(handler.per_call()) == 18


async def _stream(client: aioredis.Redis, twin: int, count: int, pace_s: float) -> list[str]:
    """``count`` calls to twin's ``work``, a few every ``pace_s``; their rets."""
    rets: list[str] = []
    for i in range(0, count, 5):
        docs = [seed_request("work", [twin], str(j).encode(), exp=40) for j in range(i, i + 5)]
        await client.rpush(keys.BUS_LOCAL, *[json.dumps(d) for d in docs])
        rets += [d["ret"] for d in docs]
        await asyncio.sleep(pace_s)
    return rets


async def _role_within(bus: Bus, role: str, limit_s: float) -> float | None:
    """Seconds until ``bus`` says it has ``role`` (None: not within ``limit_s``)."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        if await bus.role() == role:
            return time.monotonic() - began
        await asyncio.sleep(0.1)
    return None


async def test_kill_9_of_the_active_bus_under_calls_hands_over_exactly_once(twins, buses):
    a, b = twins(2)
    b.spawn()
    handler = Handler(hold_after=40)
    _, task = serve(b, work=handler.work)
    first = buses(a, "first")
    second = buses(a, "second")
    ra = aioredis.Redis.from_url(a.url)
    try:
        standby = await second.role()
        calls = asyncio.create_task(_stream(ra, b.id, 300, 0.05))
        await eventually(lambda: len(handler.executions) >= 60)
        first.signal(signal.SIGKILL)
        handler.released.set()
        pending = await ra.hlen(keys.BUS_BACKLOG)
        took_over = await _role_within(second, "active", TTL_S + 4)
        rets = await calls
        answers = await _answers(ra, rets, wait=40)
    finally:
        await stop(task)
        await ra.aclose()
    log.warning(
        "standby active %ss after the kill (lease ttl %ss), %d in flight", took_over, TTL_S, pending
    )
    assert pending > 0  # calls were in flight at the kill
    assert len(answers) == 300, f"{300 - len(answers)} calls never answered"
    failed = {ret: ans["err"] for ret, ans in answers.items() if ans["err"]}
    assert not failed, failed
    counts = handler.per_call()
    assert len(counts) == 300 and set(counts.values()) == {1}, counts.most_common(3)
    assert standby == "standby" and took_over is not None, second.log()[-2000:]


async def test_a_bus_frozen_past_its_lease_writes_nothing_and_steps_down(twins, buses):
    a, b = twins(2)
    b.spawn()
    handler = Handler(hold_after=30)
    _, task = serve(b, work=handler.work)
    first = buses(a, "first")
    second = buses(a, "second")
    ra = aioredis.Redis.from_url(a.url)
    try:
        calls = asyncio.create_task(_stream(ra, b.id, 200, 0.05))
        await eventually(lambda: len(handler.executions) >= 40)
        first.signal(signal.SIGSTOP)
        handler.released.set()
        took_over = await _role_within(second, "active", TTL_S + 4)
        first.signal(signal.SIGCONT)  # it wakes up believing it is active
        stood_down = await _role_within(first, "standby", 10)
        rets = await calls
        answers = await _answers(ra, rets, wait=40)
        roles = (await first.role(), await second.role())
    finally:
        await stop(task)
        await ra.aclose()
    assert len(answers) == 200 and not [r for r, ans in answers.items() if ans["err"]]
    counts = handler.per_call()
    assert len(counts) == 200 and set(counts.values()) == {1}, counts.most_common(3)
    assert took_over is not None and stood_down is not None, first.log()[-3000:]
    assert roles == ("standby", "active")
    down = [ln for ln in first.log().splitlines() if "standby now" in ln]
    assert len(down) == 1 and f"twin {a.id}:" in down[0], first.log()[-3000:]


async def test_a_lease_lost_from_redis_under_two_buses_leaves_one_owner(twins, buses):
    """What a Sentinel failover to a replica that lagged can do: the lease key and the
    token gone from under both buses, mid-stream. One bus ends up active, every call is
    answered once."""
    a, b = twins(2)
    b.spawn()
    handler = Handler()
    _, task = serve(b, work=handler.work)
    first = buses(a, "first")
    second = buses(a, "second")
    ra = aioredis.Redis.from_url(a.url)
    try:
        calls = asyncio.create_task(_stream(ra, b.id, 200, 0.05))
        await eventually(lambda: len(handler.executions) >= 40)
        await ra.delete(lease.LEASE, lease.FENCE)
        await asyncio.sleep(TTL_S * 2)
        rets = await calls
        answers = await _answers(ra, rets, wait=40)
        roles = sorted([await first.role(), await second.role()])
    finally:
        await stop(task)
        await ra.aclose()
    assert len(answers) == 200 and not [r for r, ans in answers.items() if ans["err"]]
    counts = handler.per_call()
    assert len(counts) == 200 and set(counts.values()) == {1}, counts.most_common(3)
    assert roles == ["active", "standby"], (first.log()[-2000:], second.log()[-2000:])


async def _any_active(pair: Callable[[], list[Bus]], since: float, limit_s: float) -> float | None:
    """Seconds from ``since`` until one of ``pair()`` (the buses up then) is active (None:
    not within the limit)."""
    while time.monotonic() - since < limit_s:
        if "active" in [await bus.role() for bus in pair()]:
            return round(time.monotonic() - since, 1)
        await asyncio.sleep(0.1)
    return None


async def test_kill_9_of_active_standby_and_both_in_turn_answers_each_call_once(twins):
    """The issue's loop: kill -9 of the active bus, of the standby, of both, each restarted,
    under a stream of calls; every call answered once (handler log and ``ret`` lists)."""
    a, b = twins(2)
    b.spawn()
    handler = Handler()
    _, task = serve(b, work=handler.work)
    maker = started_buses()
    start = next(maker)
    pair = [start(a, "one"), start(a, "two")]
    ra = aioredis.Redis.from_url(a.url)
    took_over: list[float | None] = []
    try:
        calls = asyncio.create_task(_stream(ra, b.id, 400, 0.03))
        for round_, victims in enumerate(("active", "standby", "both")):
            await eventually(lambda n=round_: len(handler.executions) >= 60 * (n + 1))
            roles = [await bus.role() for bus in pair]
            dead = [i for i, r in enumerate(roles) if victims in (r, "both")]
            killed_at = time.monotonic()
            for i in dead:
                pair[i].signal(signal.SIGKILL)
            # restarted beside the survivor's takeover (a process start takes seconds
            # under load: not the takeover's time; once up, a restarted bus may be the one
            # that takes over); with no survivor, timed from the restarts
            restarts = asyncio.ensure_future(
                asyncio.gather(*[asyncio.to_thread(start, a, f"{round_}-{i}") for i in dead])
            )
            survivors = [bus for i, bus in enumerate(pair) if i not in dead]

            def up(survivors: list[Bus] = survivors, restarts: Any = restarts) -> list[Bus]:
                return survivors + (list(restarts.result()) if restarts.done() else [])

            if survivors:
                took_over.append(await _any_active(up, killed_at, TTL_S + 6))
            for i, bus in zip(dead, await restarts, strict=True):
                pair[i] = bus
            if not survivors:
                took_over.append(await _any_active(lambda: pair, time.monotonic(), TTL_S + 6))
        rets = await calls
        answers = await _answers(ra, rets, wait=60)
        roles = sorted([await bus.role() for bus in pair])
    finally:
        await stop(task)
        await ra.aclose()
        for _ in maker:
            pass
    log.warning("an active bus %s s after each round's kills (the last: after the restarts)",
                took_over)  # fmt: skip
    assert len(answers) == 400, f"{400 - len(answers)} calls never answered"
    assert not [r for r, ans in answers.items() if ans["err"]]
    counts = handler.per_call()
    assert len(counts) == 400 and set(counts.values()) == {1}, counts.most_common(3)
    assert None not in took_over and roles == ["active", "standby"]
