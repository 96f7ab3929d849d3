"""A pooled connection whose transport the loop closed is a lost connection on every loop.

uvloop's transports raise ``RuntimeError`` ("... the handler is closed"), not
``OSError``, for a write on a connection the event loop has closed already:
the server went away while redis-py still held the connection as open. No
caller's ``except RedisError`` took it; in the bus (the one process on uvloop)
it ended the coalescer's loop and the process with it (bus history seed 208, a
Redis wiped under the bus). Every client :func:`pipeline.redisio.conn.connect`
builds now raises ``ConnectionError`` for it, so that roles that retry
reconnect and the others see the outage they already handle.

The race (the server's close handled between redis-py's check of a pooled
connection and its write) cannot be timed from outside, so the tests close the
transport of a connection redis-py holds as open, on a real server, under uvloop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.exceptions
import uvloop

from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role


async def _closed_under_redis_py(url: str, role: Role) -> object:
    """A write on a pooled connection whose transport uvloop has closed: its outcome."""
    client = redisconn.connect(url, role, max_connections=1)
    try:
        assert await client.ping()
        conn: Any = await client.connection_pool.get_connection()
        conn._writer.transport.close()  # noqa: SLF001 - the state the race leaves
        await asyncio.sleep(0.05)  # the loop closes the handle
        assert conn.is_connected  # redis-py still holds it as open
        try:
            await conn.send_command("PING")
        except Exception as exc:  # noqa: BLE001 - what the caller met is the result
            return exc
        finally:
            await client.connection_pool.release(conn)
        return await client.ping()  # the next command on the pool
    finally:
        await client.aclose()


def _on_uvloop(run: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run())  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", ["plain", "sentinel"])
def test_a_write_on_a_closed_transport_is_a_connection_error(
    layout: str, redis_url: str, request: pytest.FixtureRequest
) -> None:
    url = redis_url if layout == "plain" else request.getfixturevalue("sentinel_url")
    outcome = _on_uvloop(lambda: _closed_under_redis_py(url, Role.BUS))
    assert isinstance(outcome, redis.exceptions.ConnectionError), repr(outcome)
    assert "connection lost" in str(outcome)


async def _dropped_then_used(url: str, role: Role) -> list[object]:
    """Two pipelines on a pool whose one connection the server killed while it was idle."""
    client = redisconn.connect(url, role, max_connections=1)
    admin = redisconn.connect(url, Role.CLI)
    outcomes: list[object] = []
    try:
        await admin.client_kill_filter(_id=await client.client_id())
        await asyncio.sleep(0.2)
        for _ in range(2):
            try:
                outcomes.append(await client.pipeline(transaction=False).ping().execute())
            except Exception as exc:  # noqa: BLE001 - what the caller met is the result
                outcomes.append(exc)
        return outcomes
    finally:
        await client.aclose()
        await admin.aclose()


def test_a_connection_the_server_dropped_fails_one_pipeline_of_a_role_without_retries(
    redis_url: str,
) -> None:
    """The neighbour, as the bus meets it: the pipeline that finds the connection dead
    gets a ``ConnectionError`` (its callers' "Redis away"), the next one a new connection."""
    first, second = _on_uvloop(lambda: _dropped_then_used(redis_url, Role.BUS))
    assert isinstance(first, redis.exceptions.ConnectionError), repr(first)
    assert second == [True]


def test_a_role_with_retries_reconnects_under_the_same_pipeline(redis_url: str) -> None:
    assert _on_uvloop(lambda: _dropped_then_used(redis_url, Role.CLI)) == [[True], [True]]
