"""The stream service's pulls: long polls, bounded in number, each answered once.

A consumer that is behind gets a packed fetch
(:data:`~pipeline.streams.scripts.FETCH`: one bulk reply per batch, bounded in
bytes, nil when the stream is gone); a caught-up one (or an empty fetch) gets
``XREAD BLOCK wait_ms`` (bounded by ``max_wait_ms``; an empty answer checks
the stream still exists). Each pull runs in its own task, or in its client's
task when the client is on this node, at most ``max_pulls`` at once either
way; further pulls wait in a queue of ``max_waiting_pulls`` (started as slots
free up, answered ``unavailable`` beyond it). An entry too large for the
node's payload limit goes to the dead-letter stream, so it never blocks one.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import msgpack
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from pipeline import keys
from pipeline.redisio import conn as redisconn
from pipeline.routing.message import Route
from pipeline.streams import protocol as p
from pipeline.streams.scripts import FIELD
from pipeline.streams.servicebase import (
    DEAD_LETTER_MAXLEN,
    INDEX_RE,
    INTERNAL_ERROR,
    REDIS_UNAVAILABLE,
    Origin,
    ServiceBase,
    return_route,
    text_of,
)
from pipeline.streams.serviceredis import REDIS_ERRORS

#: Most entries one blocking XREAD returns (the fast path is the packed fetch).
BLOCK_COUNT = 64


class PullSide(ServiceBase):
    """How the stream service pulls: slots, the waiting queue, the fetch and the long poll."""

    max_pull: int
    max_wait_ms: int
    max_pulls: int
    max_waiting_pulls: int
    #: Pulls in their own task, and those served in their client's task (serve_now),
    #: which hold a slot too; the pulls waiting for a slot.
    _pulls: set[asyncio.Task[None]]
    _inline_pulls: int
    _waiting: collections.deque[tuple[Origin, str, p.Pull, str]]
    #: Streams whose last pull was a full batch (bounded by the number of streams).
    _busy: set[str]
    _fetch_script: AsyncScript

    async def _start_pull(self, ctx: Origin, stream: str, req: p.Pull) -> None:
        index = req.index or "0-0"
        if not INDEX_RE.match(index):
            await self._error(ctx, req.request_id, p.ErrorCode.BAD_REQUEST, f"bad index {index!r}")
            return
        if self._active_pulls() < self.max_pulls:
            self._spawn_pull(ctx, stream, req, index)
        elif len(self._waiting) < self.max_waiting_pulls:
            self._count("pulls_waited")
            self._waiting.append((ctx, stream, req, index))  # started when a slot frees up
        else:
            self._count("pulls_refused")
            await self._error(ctx, req.request_id, p.ErrorCode.UNAVAILABLE, "too many pulls")

    def _spawn_pull(self, ctx: Origin, stream: str, req: p.Pull, index: str) -> None:
        task = asyncio.create_task(self._pull(ctx, stream, req, index))
        self._pulls.add(task)
        task.add_done_callback(self._pull_done)

    def _active_pulls(self) -> int:
        """Pulls holding a slot: in their own task, or served in a client's (serve_now)."""
        return len(self._pulls) + self._inline_pulls

    def _pull_done(self, task: asyncio.Task[None]) -> None:
        self._pulls.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._count("pull_failures")
            self._logger.error("stream service: pull failed: %r", task.exception())
        if not task.cancelled():
            self._start_waiting()

    def _start_waiting(self) -> None:
        """Start the oldest waiting pull if a slot is free."""
        if self._waiting and self._active_pulls() < self.max_pulls:
            self._spawn_pull(*self._waiting.popleft())

    async def _pull(self, ctx: Origin, stream: str, req: p.Pull, index: str) -> None:
        await self._answer(ctx, await self._pull_reply(return_route(ctx), stream, req, index))

    async def _pull_reply(
        self, origin: Route, stream: str, req: p.Pull, index: str, held: bool = False
    ) -> p.StreamMessage:
        """The reply to one pull: its entries, or an error (``held``: served in a local
        client's task, on a held client; see ``_held``)."""
        key = self._key(stream)
        limit = max(1, min(req.limit, self.max_pull))
        wait = max(0, min(req.wait_ms, self.max_wait_ms))
        redis = self._held.take() if held else self.redis
        try:
            entries: list[tuple[bytes, bytes]] | None = []
            if stream in self._busy or not wait:
                entries = await self._fetch(redis, key, index, limit)
            if entries is not None and not entries and wait:
                # Caught up: wait for the next entries (a bounded long poll).
                found: Any = await redis.xread(
                    {key: index}, count=min(limit, BLOCK_COUNT), block=wait
                )
                entries = [
                    (eid, fields.get(FIELD, b"")) for eid, fields in (found[0][1] if found else [])
                ]
                if not entries and not await redis.exists(key):
                    entries = None
            if entries is None:
                text = f"stream {stream!r} does not exist"
                return self._fail(origin, req.request_id, p.ErrorCode.NOT_FOUND, text)
            # A consumer that is behind gets the packed fetch next time.
            if len(entries) >= BLOCK_COUNT:
                self._busy.add(stream)
            else:
                self._busy.discard(stream)
            messages, next_index = await self._fit(stream, entries, index)
        except REDIS_ERRORS as exc:
            redisconn.checkpoint(exc)
            code, text = p.ErrorCode.UNAVAILABLE, REDIS_UNAVAILABLE
            return self._fail(origin, req.request_id, code, text, exc)
        except Exception as exc:  # e.g. an entry Redis holds in a shape we did not write
            self._count("internal_errors")
            self._logger.exception("stream service: pull of %s failed", stream)
            code, text = p.ErrorCode.BAD_REQUEST, INTERNAL_ERROR
            return self._fail(origin, req.request_id, code, text, exc)
        finally:
            if held and not self._held.keep(redis):
                await redis.aclose()
        self._count("pulled", len(messages))
        return p.Messages(request_id=req.request_id, messages=messages, next_index=next_index)

    async def _fetch(
        self, redis: Redis, key: str, index: str, limit: int
    ) -> list[tuple[bytes, bytes]] | None:
        budget = self._budget()
        packed = await self._fetch_script(
            keys=[key], args=[index, limit, FIELD, budget], client=redis
        )
        if packed is None:
            return None
        flat = msgpack.unpackb(packed, raw=True)
        if not isinstance(flat, list):  # cmsgpack packs an empty table as a map
            return []
        return list(zip(flat[::2], flat[1::2], strict=True))

    def _budget(self) -> int:
        return (self._node.max_payload if self._node else 1 << 20) - 4096

    async def _fit(
        self, stream: str, entries: list[tuple[bytes, bytes]], index: str
    ) -> tuple[tuple[tuple[str, bytes], ...], str]:
        """Keep the reply under the node's payload limit.

        An entry that alone exceeds it can never be routed: it is moved to the
        dead-letter stream (logged, counted) and the reply's ``next_index``
        moves past it, so it never blocks the stream.
        """
        budget = self._budget()
        out: list[tuple[str, bytes]] = []
        used = 0
        next_index = index
        for eid, data in entries:
            entry_id = text_of(eid)
            size = len(data) + len(entry_id) + 16
            if size > budget:
                reason = f"entry of {len(data)} bytes exceeds the node limit {budget}"
                self._logger.error(
                    "stream service: %s: %s moved to dead letters: %s", stream, entry_id, reason
                )
                self._count("oversized_entries")
                await self.redis.xadd(
                    keys.dead_letter(stream),
                    {FIELD: data, "index": entry_id, "reason": reason},
                    maxlen=DEAD_LETTER_MAXLEN,
                    approximate=True,
                )
                next_index = entry_id
                continue
            if used + size > budget:
                break
            used += size
            out.append((entry_id, data))
            next_index = entry_id
        return tuple(out), next_index
