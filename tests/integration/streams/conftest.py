"""Nodes with a stream service and a stream transport on the test's real redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from pipeline.routing.node import Context, Node, Worker
from pipeline.streams.service import StreamService
from pipeline.streams.serviceredis import connect, connect_hot
from pipeline.streams.transport import StreamTransport
from tests.support.poll import until

MakeNode = Callable[..., Awaitable[tuple[Node, StreamTransport]]]


class Recorder(Worker):
    """Keeps every message it gets."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.message)


async def eventually(check: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Poll ``check`` until true (:func:`tests.support.poll.until`, ``limit_s`` its deadline)."""
    await until(check, within_s=limit_s)


@pytest.fixture
async def make_node(redis_url: str) -> AsyncIterator[MakeNode]:
    made: list[tuple[Node, Redis]] = []

    async def make(
        name: str,
        *,
        url: str | None = None,
        lease_ttl_ms: int = 3000,
        max_payload: int = 1 << 20,
        max_failures: int = 3,
        service_max_payload: int | None = None,
        **service: int,
    ) -> tuple[Node, StreamTransport]:
        redis = connect(url or redis_url)
        node = Node(name, max_payload=max_payload, trace_size=1000)
        transport = StreamTransport(lease_ttl_ms=lease_ttl_ms, max_failures=max_failures)
        node.register_transport(transport)
        await node.add_worker(
            "stream_service",
            StreamService(
                redis,
                max_payload=service_max_payload or max_payload + 65536,
                hot=connect_hot(url or redis_url),
                **{"max_wait_ms": 500, **service},
            ),
        )
        await node.start()
        made.append((node, redis))
        return node, transport

    yield make
    for node, redis in made:
        await node.stop(grace_s=5)
        await redis.aclose()
