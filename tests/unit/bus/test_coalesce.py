"""The coalescer's loop outlives a connection lost in any form.

uvloop's transports raise ``RuntimeError`` ("unable to perform operation on
<TCPTransport closed=True ...>; the handler is closed"), not ``OSError``, for a
write on a connection already closed: Redis restarted under a pipeline. Before,
that ended the loop, so the bus process (bus history seed 208, a receiver whose
Redis was wiped): here its callers get a ConnectionError and the next pipeline
goes out. The loop against a real Redis is in tests/integration/bus/test_store.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.exceptions

from pipeline.bus.coalesce import Coalescer

CLOSED = (
    "unable to perform operation on <TCPTransport closed=True reading=False 0x1>; "
    "the handler is closed"
)


class _Pipeline:
    """A pipeline whose first execute meets a closed uvloop transport (or ``first``)."""

    def __init__(self, owner: _Client) -> None:
        self._owner, self._commands = owner, 0

    async def __aenter__(self) -> _Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def ping(self) -> None:
        self._commands += 1

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        self._owner.executed += 1
        if self._owner.executed == 1:
            raise self._owner.first
        return [True] * self._commands


class _Client:
    def __init__(self, first: BaseException) -> None:
        self.first, self.executed = first, 0

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self)


async def test_a_closed_uvloop_transport_is_a_lost_connection_and_the_loop_goes_on() -> None:
    client = _Client(RuntimeError(CLOSED))
    coalescer = Coalescer(client)  # type: ignore[arg-type]
    loop = asyncio.create_task(coalescer.run())
    try:
        with pytest.raises(redis.exceptions.ConnectionError, match="connection lost"):
            await asyncio.wait_for(coalescer.call(lambda pipe: pipe.ping()), 5)
        assert await asyncio.wait_for(coalescer.call(lambda pipe: pipe.ping()), 5) is True
        assert not loop.done()
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_any_other_runtime_error_still_ends_the_loop() -> None:
    coalescer = Coalescer(_Client(RuntimeError("a bug")))  # type: ignore[arg-type]
    loop = asyncio.create_task(coalescer.run())
    call = asyncio.create_task(coalescer.call(lambda pipe: pipe.ping()))
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(loop, 5)
    with pytest.raises(asyncio.CancelledError):
        await call  # cancelled by the loop's end, not left waiting
