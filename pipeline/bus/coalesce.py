"""Many small Redis calls from concurrent coroutines, sent as one pipeline.

HTTP handlers and senders each need one Redis command (a Lua script, an
HDEL). Sent one by one, each costs a round trip and a pooled connection;
queued here, whatever accumulated while the previous pipeline ran goes out
together. The queue is bounded, so callers wait when Redis falls behind.

Scripts go in as plain ``EVALSHA`` (redis-py's script objects would add a
``SCRIPT EXISTS`` round trip to every pipeline); a command that meets
``NOSCRIPT`` (Redis restarted and lost its script cache) is sent once more
after the scripts are loaded again. The pipeline is not a transaction, so the
other commands of its batch are unaffected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from pipeline.bus.config import reraise_if_cancelling
from pipeline.redisio.conn import checkpoint

#: Adds exactly one command to the pipeline it is given.
Command = Callable[[Any], Awaitable[Any] | Any]
#: Loads the Lua scripts the commands run by EVALSHA.
Reload = Callable[[], Awaitable[None]]


class Coalescer:
    def __init__(
        self, client: aioredis.Redis, *, max_batch: int = 512, reload: Reload | None = None
    ) -> None:
        self._redis = client
        self._max_batch = max_batch
        self._reload = reload
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
                # A cancellation dropped by redis-py in the last pipeline (see
                # pipeline.bus.tasks) ends the loop here, not in a queue.get() forever.
                checkpoint()
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
            results = await self._execute(batch)
            missing = [
                i for i, r in enumerate(results) if isinstance(r, redis.exceptions.NoScriptError)
            ]
            if missing and self._reload is not None:
                await self._reload()
                again = await self._execute([batch[i] for i in missing])
                for i, result in zip(missing, again, strict=True):
                    results[i] = result
        except (redis.exceptions.RedisError, OSError) as exc:
            # A cancel turned into a connection error must still end run(): nothing
            # else would wake its queue.get() once the bus is stopping.
            reraise_if_cancelling(exc)
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

    async def _execute(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for command, _ in batch:
                added = command(pipe)
                if isinstance(added, Awaitable):
                    await added
            return list(await pipe.execute(raise_on_error=False))
