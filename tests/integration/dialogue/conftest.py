"""Dialogue connections over a real socketpair (both ends in this process)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from pipeline.dialogue.connection import Connection
from pipeline.dialogue.protocol import Role

Connect = Callable[..., Awaitable[tuple[Connection, Connection]]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """``await connect(client_options, server_options)`` -> started (client, server)."""
    made: list[Connection] = []

    async def _connect(
        client: dict[str, Any] | None = None, server: dict[str, Any] | None = None
    ) -> tuple[Connection, Connection]:
        import asyncio

        a, b = socket.socketpair()
        ra, wa = await asyncio.open_connection(sock=a)
        rb, wb = await asyncio.open_connection(sock=b)
        c = Connection.over_streams(ra, wa, Role.CLIENT, name="client", **(client or {}))
        s = Connection.over_streams(rb, wb, Role.SERVER, name="server", **(server or {}))
        made.extend([c, s])
        c.start()
        s.start()
        return c, s

    yield _connect
    for conn in made:
        await conn.close(timeout=1.0)
