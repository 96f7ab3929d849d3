"""The stream service's pushes: each a Lua script in Redis, idempotent by its request id.

A push is one ``EVALSHA`` of :data:`~pipeline.streams.scripts.PUSH`: if its
dedup key exists the first push's indexes come back (DUPLICATE), else every
entry is ``XADD``-ed and the indexes remembered for ``dedup_ttl_ms``. All
pushes the mailbox holds go to Redis in one pipeline; a single push (and one
served in a local client's task, on a held client) goes without one. With a
durability level, ``WAIT`` follows on the same connections.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from pipeline import keys
from pipeline.redisio import conn as redisconn
from pipeline.routing.message import Route
from pipeline.streams import protocol as p
from pipeline.streams.scripts import FIELD, PUSH
from pipeline.streams.servicebase import (
    REDIS_UNAVAILABLE,
    Origin,
    ServiceBase,
    return_route,
    text_of,
)
from pipeline.streams.serviceredis import REDIS_ERRORS


class PushSide(ServiceBase):
    """How the stream service pushes: a batch's pushes together, or one in its caller's task."""

    dedup_ttl_ms: int
    #: The push script's SHA once loaded (None again when Redis forgot it).
    _push_sha: str | None

    async def _push_all(self, pushes: list[tuple[Origin, str, p.Push]]) -> None:
        replies = await self._push_replies(
            [(return_route(ctx), stream, req) for ctx, stream, req in pushes]
        )
        for (ctx, _, _), reply in zip(pushes, replies, strict=True):
            await self._answer(ctx, reply)

    async def _push_replies(self, pushes: list[tuple[Route, str, p.Push]]) -> list[p.StreamMessage]:
        """Push them all (see :meth:`_run_pushes`); one reply per push, in order."""
        try:
            results = await self._run_pushes(pushes)
            if any(isinstance(r, NoScriptError) for r in results):
                # Redis restarted and forgot the script: load it and push again
                # (safe: a push is idempotent by its request id).
                self._push_sha = None
                results = await self._run_pushes(pushes)
        except REDIS_ERRORS as exc:
            redisconn.checkpoint(exc)
            code, text = p.ErrorCode.UNAVAILABLE, REDIS_UNAVAILABLE
            return [
                self._fail(origin, req.request_id, code, text, exc) for origin, _, req in pushes
            ]
        return [
            self._push_reply(origin, req, result)
            for (origin, _, req), result in zip(pushes, results, strict=True)
        ]

    def _push_reply(self, origin: Route, req: p.Push, result: Any) -> p.StreamMessage:
        """The reply to a push from what its script returned (or the error it raised)."""
        if isinstance(result, Exception):
            code, text = p.ErrorCode.UNAVAILABLE, REDIS_UNAVAILABLE
            return self._fail(origin, req.request_id, code, text, result)
        status, joined = result
        self._gate.ended(p.ErrorCode.UNAVAILABLE, "stream service: redis takes pushes again")
        indexes = tuple(text_of(joined).split(",")) if joined else ()
        self._count("pushed" if status else "duplicate_pushes", len(req.data) if status else 1)
        return p.PushConfirm(request_id=req.request_id, status=int(status), indexes=indexes)

    async def _push_one(self, stream: str, req: p.Push) -> Any:
        """One push (:meth:`_push_replies` for one, without its lists): what the script
        returned, or the Redis error it raised."""
        try:
            result = (await self._run_pushes([(None, stream, req)], held=True))[0]
            if isinstance(result, NoScriptError):  # Redis restarted: see _push_replies
                self._push_sha = None
                result = (await self._run_pushes([(None, stream, req)], held=True))[0]
        except REDIS_ERRORS as exc:
            redisconn.checkpoint(exc)
            return exc
        return result

    async def _run_pushes(
        self, pushes: Sequence[tuple[object, str, p.Push]], *, held: bool = False
    ) -> list[Any]:
        """All pushes in one round trip (EVALSHA of the push script per push); ``held``:
        one push served in a local client's task, on a held client (see ``_held``)."""
        if self._push_sha is None:
            self._push_sha = text_of(await self.redis.script_load(PUSH))
        if self.durability.on:
            return await self._run_replicated(pushes)
        if len(pushes) == 1:  # no pipeline for one push: fewer loop hops, lower latency
            _, stream, req = pushes[0]
            redis = self._held.take() if held else self.redis
            try:
                result = await redis.evalsha(
                    self._push_sha,
                    2,
                    self._key(stream),
                    keys.push_dedup(stream, req.request_id),
                    self.dedup_ttl_ms,
                    FIELD,
                    *req.data,
                )
            except NoScriptError as exc:
                return [exc]
            finally:
                if held and not self._held.keep(redis):
                    await redis.aclose()
            return [result]
        async with self.redis.pipeline(transaction=False) as pipe:
            self._queue_pushes(pipe, pushes)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    def _queue_pushes(self, pipe: Any, pushes: Sequence[tuple[object, str, p.Push]]) -> None:
        assert self._push_sha is not None
        for _, stream, req in pushes:
            redisconn.pipe_evalsha(
                pipe,
                self._push_sha,
                [self._key(stream), keys.push_dedup(stream, req.request_id)],
                [self.dedup_ttl_ms, FIELD, *req.data],
            )

    async def _run_replicated(self, pushes: Sequence[tuple[object, str, p.Push]]) -> list[Any]:
        """:meth:`_run_pushes` followed by ``WAIT`` on the same connections (see
        :mod:`pipeline.redisio.durability`): a push fewer replicas took than required becomes a
        :class:`~pipeline.redisio.durability.NotReplicated` error (its client retries it; a push is
        idempotent by its request id)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            self._queue_pushes(pipe, pushes)
            self.durability.add_waits(pipe, self.redis, {self._key(s) for _, s, _ in pushes})
            results: list[Any] = await pipe.execute(raise_on_error=False)
        pushed, acks = results[: len(pushes)], results[len(pushes) :]
        failure = self.durability.check(acks)
        if failure is None:
            return pushed
        self._count("not_replicated", len(pushes))
        return [r if isinstance(r, Exception) else failure for r in pushed]
