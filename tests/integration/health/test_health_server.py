"""HealthServer in process: 200/503, check timeouts, one evaluation shared by a probe storm."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

from pipeline.errors import ConfigError
from pipeline.runtime import health
from pipeline.runtime.health import HealthServer, Sample
from tests.support.poll import until


async def test_healthz_reports_each_check_and_shares_evaluations(monkeypatch) -> None:
    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.3)
    state = {"fail": False, "calls": 0}

    async def flaky() -> None:
        state["calls"] += 1
        if state["fail"]:
            raise ConnectionError("redis refused")

    async def slow() -> None:
        await asyncio.sleep(0.05)

    server = HealthServer(
        "127.0.0.1", 0, "sluice_test",
        checks={"redis": flaky, "slow": slow},
        samples=lambda: [Sample(name="sluice_test_things_total", value=7, kind="counter")],
    )  # fmt: skip
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            replies = await asyncio.gather(
                *(session.get(f"{server.url}/healthz") for _ in range(100))
            )
            bodies = [await r.json() for r in replies]
            assert {r.status for r in replies} == {200}
            assert bodies[0]["checks"] == {"redis": "ok", "slow": "ok"}
            assert server.evaluations == 1 and state["calls"] == 1
            state["fail"] = True

            async def degraded() -> dict[str, Any] | None:
                async with session.get(f"{server.url}/healthz") as reply:
                    return await reply.json() if reply.status == 503 else None

            # 200 from the cache for up to CACHE_S, then 503 (polled: no sleep-then-assert)
            body = await until(degraded, "503 once the cached result expired")
            assert body["status"] == "degraded"
            assert body["checks"]["redis"] == "ConnectionError: redis refused"
            async with session.get(f"{server.url}/metrics") as reply:
                assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = await reply.text()
            assert "sluice_test_up 1" in text and "sluice_test_things_total 7" in text
            assert "sluice_test_healthy 0" in text
    finally:
        await server.stop()
        await server.stop()  # idempotent


async def test_a_hanging_check_times_out(monkeypatch) -> None:
    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.2)

    async def hang() -> None:
        await asyncio.sleep(60)

    async with health.serving("127.0.0.1:0", "sluice_test", checks={"redis": hang}) as server:
        assert server is not None
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{server.url}/healthz") as reply,
        ):
            assert reply.status == 503
            assert (await reply.json())["checks"]["redis"].startswith("timed out")


async def test_port_in_use_is_a_config_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match="already in use"):
            async with health.serving(f"127.0.0.1:{port}", "sluice_test"):
                pass


async def test_empty_listen_is_off() -> None:
    async with health.serving("", "sluice_test") as server:
        assert server is None
