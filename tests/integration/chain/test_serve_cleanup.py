"""The server's cleanup runs every step even when a background task had failed.

The warm-up and the memory releaser are awaited first at shutdown; one that
had failed re-raises its error there. Every later step must still run: the
live tailer ended, the Dialogue feed closed, both Redis clients closed. The
failure is still raised, after the last step.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline.chain.serve import server
from pipeline.chain.serve.appkeys import TAILER
from pipeline.runtime.ports import free_port
from tests.support.poll import until

_TASKS = ("warm", "memory-releaser", "redis-tailer")


class Opened:
    """The Redis clients the server opened, and those it closed (through ``aclose``)."""

    def __init__(self) -> None:
        self.clients: list[aioredis.Redis] = []
        self.closed: list[aioredis.Redis] = []
        self._connect = server.connect

    def connect(self, *args: Any, **kwargs: Any) -> aioredis.Redis:
        client = self._connect(*args, **kwargs)
        aclose = client.aclose

        async def closing(*a: Any, **kw: Any) -> None:
            self.closed.append(client)
            await aclose(*a, **kw)

        client.aclose = closing  # type: ignore[method-assign]
        self.clients.append(client)
        return client


class FailingReleaser:
    def __init__(self, failed: asyncio.Event) -> None:
        self._failed = failed

    async def run(self) -> None:
        self._failed.set()
        raise RuntimeError("releaser failed")


def _running(name: str) -> bool:
    return any(t.get_name() == name and not t.done() for t in asyncio.all_tasks())


async def _refused(port: int) -> bool:
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


@pytest.mark.parametrize("failing", ["warm", "releaser", "both"])
async def test_every_resource_is_released_when_a_background_task_failed(
    settings, serve, redis_client, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    opened = Opened()
    monkeypatch.setattr(server, "connect", opened.connect)
    warm_failed, releaser_failed = asyncio.Event(), asyncio.Event()

    async def failing_warm(*args: Any) -> None:
        warm_failed.set()
        raise RuntimeError("warm-up failed")

    if failing in ("warm", "both"):
        monkeypatch.setattr(server, "_warm", failing_warm)
    if failing in ("releaser", "both"):
        monkeypatch.setattr(server, "_releaser", lambda *a: FailingReleaser(releaser_failed))
    expected = (
        {"warm-up failed"}
        if failing == "warm"
        else {"releaser failed"}
        if failing == "releaser"
        else {"warm-up failed", "releaser failed"}
    )
    port = free_port()
    baseline = len(redis_client.client_list())
    with pytest.raises(Exception) as raised:
        async with serve(settings.replace(serve_dialogue_port=port)) as (_base, app):
            for name, event in (("warm", warm_failed), ("releaser", releaser_failed)):
                if failing in (name, "both"):
                    await asyncio.wait_for(event.wait(), 10)
            await until(lambda: _running("redis-tailer"), "the live tailer runs")
            assert app[TAILER] is not None
            assert not await _refused(port), "the Dialogue feed listens while serving"
            assert len(opened.clients) == 2
    # the failure still surfaces, after every step ran (both: together, in step order)
    errors = (
        raised.value.exceptions if isinstance(raised.value, ExceptionGroup) else (raised.value,)
    )
    assert {str(e) for e in errors} == expected, raised.value
    assert all(isinstance(e, RuntimeError) for e in errors)
    assert [name for name in _TASKS if _running(name)] == []
    assert await _refused(port), "the Dialogue feed still listens"
    assert opened.closed == opened.clients, "a Redis client was left open"
    await until(
        lambda: len(redis_client.client_list()) <= baseline,
        "the server's Redis connections closed",
        detail=redis_client.client_list,
    )
