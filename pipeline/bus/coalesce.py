"""Many small Redis calls from concurrent coroutines, sent as one pipeline.

HTTP handlers and senders each need one Redis command (a Lua script, an
HDEL). Sent one by one, each costs a round trip and a pooled connection;
queued here, whatever accumulated while the previous pipeline ran goes out
together. The queue is bounded, so callers wait when Redis falls behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

#: Adds exactly one command to the pipeline it is given.
Command = Callable[[Any], Awaitable[Any] | Any]


class Coalescer:
    def __init__(self, client: aioredis.Redis, *, max_batch: int = 512) -> None:
        self._redis = client
        self._max_batch = max_batch
        self._queue: asyncio.Queue[tuple[Command, asyncio.Future[Any]]] = asyncio.Queue(
            maxsize=max_batch * 8
        )

    async def call(self, command: Command) -> Any:
        """Run ``command`` in the next pipeline; return its result or raise its error."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put((command, future))
        return await future

    async def run(self) -> None:
        """Send queued commands until cancelled; pending callers then get CancelledError."""
        batch: list[tuple[Command, asyncio.Future[Any]]] = []
        try:
            while True:
                batch = [await self._queue.get()]
                while len(batch) < self._max_batch and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                await self._send(batch)
                batch = []
        finally:
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            for _, future in batch:
                if not future.done():
                    future.cancel()

    async def _send(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for command, _ in batch:
                    added = command(pipe)
                    if isinstance(added, Awaitable):
                        await added
                results = await pipe.execute(raise_on_error=False)
        except (redis.exceptions.RedisError, OSError) as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
