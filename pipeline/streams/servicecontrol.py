"""The stream service's control requests: every request but Push and Pull, one handler each.

``CreateStream`` gives a stream its local address on this node;
``SaveIndex`` is monotonic (:data:`~pipeline.streams.scripts.SAVE_INDEX`) and
``GetIndex`` returns ``""`` when nothing was saved; ``Lease`` / ``Release``
as in :mod:`pipeline.streams.lease`; ``DeadLetter`` appends to
``keys.dead_letter``; ``Attempts`` counts in ``keys.failures``.
:data:`_CONTROL` maps each request class to its handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.commands.core import AsyncScript

from pipeline import keys
from pipeline.streams import protocol as p
from pipeline.streams.lease import Leases
from pipeline.streams.scripts import FIELD
from pipeline.streams.servicebase import (
    DEAD_LETTER_MAXLEN,
    INDEX_RE,
    Origin,
    ServiceBase,
    text_of,
)

#: Crash counters (``Attempts``) of a stream are forgotten this long after the last one.
ATTEMPTS_TTL_MS = 7 * 24 * 3600 * 1000


class ControlSide(ServiceBase):
    """The handlers of the control requests: each returns its reply, or None when it
    already answered with an error."""

    _create_script: AsyncScript
    _save_script: AsyncScript
    _leases: Leases

    async def _control(self, ctx: Origin, req: p.StreamMessage) -> None:
        """Answer one control request through :data:`_CONTROL`, keyed by its class.

        A handler returns the reply, or None when it already answered with an
        error. A stream name no key can be built from raises ``ConfigError``,
        which the service's ``_one`` answers (``invalid stream name``).
        """
        handler = _CONTROL.get(type(req))
        if handler is None:
            rid = getattr(req, "request_id", "")
            await self._error(
                ctx, rid, p.ErrorCode.BAD_REQUEST, f"{type(req).__name__} is not a request"
            )
            return
        reply = await handler(self, ctx, req)
        if reply is not None:
            await self._answer(ctx, reply)

    async def _create(self, ctx: Origin, req: p.CreateStream) -> p.StreamMessage | None:
        key = keys.stream(req.name)
        address = self.address_of(req.name)
        if address.encode() not in self._streams and len(self._streams) >= self.max_streams:
            await self._error(ctx, req.request_id, p.ErrorCode.UNAVAILABLE, "too many streams")
            return None
        created = await self._create_script(keys=[key])
        # Separately: a global key never shares a script with a stream's keys (cluster slots).
        await self.redis.sadd(keys.streams_registry(), req.name)
        assert self._node is not None
        self._node.add_alias(self.name, address)
        self._streams[address.encode()] = req.name
        self._count("created" if created else "opened")
        return p.Init(request_id=req.request_id, name=req.name, address=address)

    async def _get_index(self, ctx: Origin, req: p.GetIndex) -> p.StreamMessage | None:
        current = await self.redis.hget(keys.consumer_index(req.stream), req.client_id)
        return p.Index(
            request_id=req.request_id,
            client_id=req.client_id,
            stream=req.stream,
            index=text_of(current),
        )

    async def _save_index(self, ctx: Origin, req: p.SaveIndex) -> p.StreamMessage | None:
        hkey = keys.consumer_index(req.stream)
        if not INDEX_RE.match(req.index):
            text = f"bad index {req.index!r}"
            await self._error(ctx, req.request_id, p.ErrorCode.BAD_REQUEST, text)
            return None
        current = await self._save_script(keys=[hkey], args=[req.client_id, req.index])
        return p.Index(
            request_id=req.request_id,
            client_id=req.client_id,
            stream=req.stream,
            index=text_of(current),
        )

    async def _lease(self, ctx: Origin, req: p.Lease) -> p.StreamMessage | None:
        state = await self._leases.acquire(req.stream, req.holder, req.ttl_ms)
        if not state.granted:
            text = (
                f"stream {req.stream!r} is consumed by {state.holder!r} "
                f"(lease expires in {state.ttl_ms} ms); {req.holder!r} refused"
            )
            await self._error(ctx, req.request_id, p.ErrorCode.LEASE_HELD, text)
            return None
        return p.Ok(request_id=req.request_id)

    async def _release(self, ctx: Origin, req: p.Release) -> p.StreamMessage | None:
        await self._leases.release(req.stream, req.holder)
        return p.Ok(request_id=req.request_id)

    async def _attempts(self, ctx: Origin, req: p.Attempts) -> p.StreamMessage | None:
        hkey = keys.failures(req.stream)
        if req.op == p.INCR:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(hkey, req.key, 1)
                pipe.pexpire(hkey, ATTEMPTS_TTL_MS)  # leftovers of a vanished consumer go
                count, _ = await pipe.execute()
        elif req.op == p.CLEAR:
            await self.redis.hdel(hkey, req.key)
            count = 0
        else:
            await self._error(
                ctx, req.request_id, p.ErrorCode.BAD_REQUEST, f"unknown op {req.op!r}"
            )
            return None
        return p.Index(
            request_id=req.request_id, client_id=req.key, stream=req.stream, index=str(count)
        )

    async def _dead_letter(self, ctx: Origin, req: p.DeadLetter) -> p.StreamMessage | None:
        fields: dict[Any, Any] = {FIELD: req.data, "index": req.index, "reason": req.reason}
        await self.redis.xadd(
            keys.dead_letter(req.stream), fields, maxlen=DEAD_LETTER_MAXLEN, approximate=True
        )
        self._count("dead_lettered")
        return p.Ok(request_id=req.request_id)


_ControlHandler = Callable[[ControlSide, Origin, Any], Awaitable[p.StreamMessage | None]]

#: The control requests (everything but Push and Pull) and their handlers.
_CONTROL: dict[type[Any], _ControlHandler] = {
    p.CreateStream: ControlSide._create,
    p.GetIndex: ControlSide._get_index,
    p.SaveIndex: ControlSide._save_index,
    p.Lease: ControlSide._lease,
    p.Release: ControlSide._release,
    p.Attempts: ControlSide._attempts,
    p.DeadLetter: ControlSide._dead_letter,
}
