"""What the parts of the stream service share: its state, its counters and how it answers.

:class:`ServiceBase` is the base of
:class:`~pipeline.streams.service.StreamService` and of its sides (push, pull,
control): it declares the state the service's constructor sets and answers a
request with a reply or a public error, logged and counted. Every module of
the service logs to its one logger (``ServiceBase._logger``).
"""

from __future__ import annotations

import logging
import re

from redis.asyncio import Redis

from pipeline import keys
from pipeline.errors import SluiceError
from pipeline.loggate import LogGate
from pipeline.redisio.durability import Durability
from pipeline.routing.message import Route
from pipeline.routing.node import Context, Node, Worker
from pipeline.streams import protocol as p
from pipeline.streams.serviceredis import HeldClients

INDEX_RE = re.compile(r"^\d{1,20}-\d{1,20}$")
DEAD_LETTER_MAXLEN = 100_000

#: Public text of every Redis failure sent to a peer (the details go to the log).
REDIS_UNAVAILABLE = "redis unavailable"
#: Seconds between two log lines of "redis unavailable" answers (all are counted).
UNAVAILABLE_LOG_S = 10.0
INTERNAL_ERROR = "internal error"

#: Where a request came from: a routed message (a client on this node uses
#: :meth:`StreamService.serve_now <pipeline.streams.service.StreamService.serve_now>`
#: or is routed like any other).
Origin = Context


def text_of(value: bytes | str | None) -> str:
    """``value`` as text (a Redis reply: bytes, text or nil, which is ``""``)."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def return_route(ctx: Origin) -> Route:
    return ctx.message.return_route


class ServiceBase(Worker):
    """The stream service's state (set by its constructor) and its ways of answering."""

    redis: Redis
    #: Replicas that must hold a push before it is confirmed (see pipeline.redisio.durability).
    durability: Durability
    max_payload: int
    max_streams: int
    name: str
    _node: Node | None
    #: The service's one logger, whichever of its modules logs: service.py's (set by the
    #: constructor), so every line keeps the logger name it had before the split.
    _logger: logging.Logger
    #: Stream name by local address, and the Redis key of each stream (bounded).
    _streams: dict[bytes, str]
    _keys: dict[str, str]
    #: Clients for requests served in a local client's task, under its deadline.
    _held: HeldClients
    #: "redis unavailable" answers are logged at most every UNAVAILABLE_LOG_S.
    _gate: LogGate

    def _key(self, stream: str) -> str:
        """``keys.stream(stream)`` of a stream created here (kept: it is built per push and pull)."""
        key = self._keys.get(stream)
        if key is None:
            key = keys.stream(stream)
            if len(self._keys) < self.max_streams:
                self._keys[stream] = key
        return key

    def address_of(self, stream: str) -> str:
        """The local address that Push and Pull for ``stream`` go to."""
        return f"{self.name}:{stream}"

    def _count(self, what: str, n: int = 1) -> None:
        if self._node is not None:
            self._node.counters[f"stream_service.{what}"] += n

    def _fail(
        self,
        origin: Route,
        request_id: str,
        code: p.ErrorCode,
        text: str,
        detail: BaseException | str | None = None,
    ) -> p.Error:
        """An error reply with ``text`` (public), logged and counted; ``detail`` (if any)
        goes only to the log."""
        self._count(str(code))
        args = (code, origin, text if detail is None else f"{text}: {detail!r}")
        if code == p.ErrorCode.UNAVAILABLE:
            self._gate.failed(code, "stream service: %s from %s: %s", *args)
        else:
            self._logger.error("stream service: %s from %s: %s", *args)
        return p.Error(request_id=request_id, code=code, message=text)

    async def _error(
        self,
        ctx: Origin,
        request_id: str,
        code: p.ErrorCode,
        text: str,
        detail: BaseException | str | None = None,
    ) -> None:
        """Answer with ``text`` (public); ``detail`` (if any) goes only to the log."""
        await self._answer(ctx, self._fail(return_route(ctx), request_id, code, text, detail))

    async def _answer(self, ctx: Origin, reply: p.StreamMessage) -> None:
        try:
            await ctx.reply(p.encode(reply))
        except SluiceError as exc:  # its client times out and asks again; the others go on
            self._count("replies_not_sent")
            self._logger.warning(
                "stream service: reply to %s not sent: %s", ctx.message.return_route, exc
            )
