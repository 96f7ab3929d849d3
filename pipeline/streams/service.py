"""The stream service worker: the stream protocol (see ``protocol.py``) on Redis Streams.

Run one per node at local address ``stream_service``; clients reach it only
through routed messages. ``CreateStream{name}`` gives the stream a local
address on this node (``stream_service:<name>``) that ``Push`` and ``Pull``
are sent to; Redis is the store shared between nodes.

The service is one worker whose roles live in their own modules:

* Push (:mod:`pipeline.streams.servicepush`): one Lua script per push
  (atomic): if ``keys.push_dedup`` exists, the first push's indexes are
  returned (status DUPLICATE); else every entry is ``XADD``-ed and the indexes
  remembered for ``dedup_ttl_ms``. All pushes the mailbox holds go to Redis in
  one pipeline.
* Pull (:mod:`pipeline.streams.servicepull`): a long poll. A consumer that is
  behind gets a Lua ``XRANGE`` that Redis packs with cmsgpack (one bulk reply
  per batch, bounded in bytes, nil when the stream is gone); a caught-up one
  (or an empty fetch) gets ``XREAD BLOCK wait_ms`` (bounded by
  ``max_wait_ms``; an empty answer checks the stream still exists). Each pull
  runs in its own task, or in its client's task when the client is on this
  node (:meth:`StreamService.serve_now`), at most ``max_pulls`` at once either
  way; further pulls wait in a queue of ``max_waiting_pulls`` (started as
  slots free up, answered ``unavailable`` beyond it), so held long polls never
  stall a push, even one in the same batch.
* A client on this node has its pushes and pulls served in its own task
  (``serve_now``, here): the same checks, errors and counters as a routed
  request, without its message, mailbox hop and codec; its other requests are
  routed. The hot commands (a single push, a pull) run on single-connection
  clients of the service's pool held between commands
  (:class:`~pipeline.streams.serviceredis.HeldClients`).
* Control (:mod:`pipeline.streams.servicecontrol`): SaveIndex is monotonic
  (Lua compare of entry ids); GetIndex returns ``""`` when nothing was saved.
  Leases (``Lease`` / ``Release``) as in ``lease.py``; ``DeadLetter`` appends
  to ``keys.dead_letter``; ``Attempts`` counts in ``keys.failures``.

The Lua scripts are in :mod:`pipeline.streams.scripts`, the Redis clients in
:mod:`pipeline.streams.serviceredis`, and the state and the ways of answering
every side shares in :mod:`pipeline.streams.servicebase`.

Every bad request, every Redis failure and every bug a request can trigger
is answered with an ``Error`` reply, logged and counted
(``node.counters["stream_service.<what>"]``), one request at a time: none
stops the service or the other requests of its batch. Only public texts go
into an ``Error`` (what was wrong with the request, ``redis unavailable``,
``internal error``); the details stay in the log.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence

from redis.asyncio import Redis

from pipeline.errors import ConfigError, PayloadTooLarge, RemoteProtocolError
from pipeline.loggate import LogGate
from pipeline.redisio import conn as redisconn
from pipeline.redisio.durability import Durability
from pipeline.routing.message import Address, Route
from pipeline.routing.node import Context, Node, WorkerContext
from pipeline.streams import protocol as p
from pipeline.streams.lease import Leases
from pipeline.streams.scripts import CREATE, FETCH, SAVE_INDEX
from pipeline.streams.servicebase import (
    INDEX_RE,
    INTERNAL_ERROR,
    REDIS_UNAVAILABLE,
    UNAVAILABLE_LOG_S,
    Origin,
    return_route,
)
from pipeline.streams.servicecontrol import ControlSide
from pipeline.streams.servicepull import PullSide
from pipeline.streams.servicepush import PushSide
from pipeline.streams.serviceredis import HELD_IDLE, REDIS_ERRORS, HeldClients

log = logging.getLogger(__name__)


def _request_id(ctx: Origin) -> str:
    return p.peek_request_id(ctx.payload)


class StreamService(PushSide, PullSide, ControlSide):
    """Serves the stream protocol for the clients of one node."""

    mailbox_size = 4096
    batch_size = 512

    def __init__(
        self,
        redis: Redis,
        *,
        max_payload: int = 1 << 20,
        max_pull: int = 5000,
        max_wait_ms: int = 5000,
        max_pulls: int = 64,
        max_waiting_pulls: int = 4096,
        max_streams: int = 4096,
        dedup_ttl_ms: int = 600_000,
        hot: Redis | None = None,
        durability: Durability | None = None,
    ) -> None:
        self.redis = redis
        #: Replicas that must hold a push before it is confirmed (see pipeline.redisio.durability).
        self.durability = durability or Durability()
        self.max_payload = max_payload
        self.max_pull = max_pull
        self.max_wait_ms = max_wait_ms
        self.dedup_ttl_ms = dedup_ttl_ms
        self.max_pulls = max(1, max_pulls)
        self.max_waiting_pulls = max_waiting_pulls
        self.max_streams = max_streams
        self._pulls: set[asyncio.Task[None]] = set()
        #: Pulls served in their client's task (:meth:`serve_now`), holding a slot too.
        self._inline_pulls = 0
        self._waiting: collections.deque[tuple[Origin, str, p.Pull, str]] = collections.deque()
        self._streams: dict[bytes, str] = {}
        self._keys: dict[str, str] = {}
        #: Streams whose last pull was a full batch (bounded by the number of streams).
        self._busy: set[str] = set()
        self._push_sha: str | None = None
        self._create_script = redis.register_script(CREATE)
        self._fetch_script = redis.register_script(FETCH)
        self._save_script = redis.register_script(SAVE_INDEX)
        self._leases = Leases(redis)
        #: Clients for requests served in a local client's task, under its deadline
        #: (``hot``: see :func:`~pipeline.streams.serviceredis.connect_hot`; else ``redis``, with its socket timeout).
        #: Routed requests have no caller's deadline here: they use ``redis``.
        self._held = HeldClients(hot if hot is not None else redis, HELD_IDLE)
        self._hot = hot
        self._node: Node | None = None
        self._closing = False
        self.name = "stream_service"
        #: "redis unavailable" answers are logged at most every UNAVAILABLE_LOG_S: when
        #: Redis is away or refuses writes every client retries, each answer counted.
        self._gate = LogGate(log, UNAVAILABLE_LOG_S, level=logging.ERROR)
        self._logger = log

    async def setup(self, wctx: WorkerContext) -> None:
        self._node = wctx.node
        self.name = wctx.name

    async def serve_inline(
        self, address: Address, request: object, origin: Route
    ) -> p.StreamMessage | None:
        """:meth:`serve_now` for a push or pull that fits the limits the codec checks
        (the node's and this service's ``max_payload``), asked through
        :meth:`Node.call_inline <pipeline.routing.node.Node.call_inline>`; None for
        the rest, which the caller routes."""
        if not isinstance(request, (p.Push, p.Pull)):
            return None
        size = p.size_bound(request)
        node_max = self._node.max_payload if self._node is not None else self.max_payload
        if size is None or size > min(self.max_payload, node_max):
            return None
        return await self.serve_now(address, request, origin)

    async def serve_now(
        self, address: Address, request: p.Push | p.Pull, origin: Route
    ) -> p.StreamMessage | None:
        """Serve a push or pull of a client on this node in the caller's task and return
        the reply (a pull's long poll included); None when it cannot be served so: the
        service is stopping, or every pull slot is taken (then routing queues it).

        The fast path of a :class:`~pipeline.streams.client.StreamClient` on this node:
        no task, no future, no codec, no mailbox (about half of a stream-transport round
        trip's Python work otherwise). ``request`` must be one the codec would accept
        (the client checks its size); it is served exactly as a routed one would be,
        with the same errors, limits and counters. A pull served so holds a pull slot.
        Cancelling the caller cancels the Redis command it waits on. The caller
        records the request and the reply in the node's trace.
        """
        if self._closing:
            return None
        try:
            stream = self._streams.get(address.value)
            if stream is None:
                text = f"no stream at address {address}"
                reply: p.StreamMessage = self._fail(
                    origin, request.request_id, p.ErrorCode.NOT_FOUND, text
                )
            elif isinstance(request, p.Push):
                reply = self._push_reply(origin, request, await self._push_one(stream, request))
            else:
                index = request.index or "0-0"
                if not INDEX_RE.match(index):
                    text = f"bad index {index!r}"
                    reply = self._fail(origin, request.request_id, p.ErrorCode.BAD_REQUEST, text)
                elif self._active_pulls() >= self.max_pulls:
                    return None
                else:
                    self._inline_pulls += 1
                    try:
                        reply = await self._pull_reply(origin, stream, request, index, True)
                    finally:
                        self._inline_pulls -= 1
                        self._start_waiting()
        except Exception as exc:  # a bug a request triggers: an error reply, as when routed
            self._count("internal_errors")
            log.exception("stream service: request from %s failed", origin)
            reply = self._fail(
                origin, request.request_id, p.ErrorCode.BAD_REQUEST, INTERNAL_ERROR, exc
            )
        return reply

    def stopping(self) -> None:
        self._closing = True

    async def handle(self, ctx: Context) -> None:
        await self.handle_batch([ctx])

    async def handle_batch(self, batch: Sequence[Origin]) -> None:
        """Every request of the batch is answered, each on its own: pushes go to Redis
        together after the loop, pulls are started (or queued) without waiting."""
        pushes: list[tuple[Origin, str, p.Push]] = []
        for ctx in batch:
            try:
                await self._one(ctx, pushes)
            except Exception as exc:  # a bug a request triggers must not take the batch down
                self._count("internal_errors")
                log.exception("stream service: request from %s failed", return_route(ctx))
                rid = _request_id(ctx)
                await self._error(ctx, rid, p.ErrorCode.BAD_REQUEST, INTERNAL_ERROR, exc)
        if pushes:
            await self._push_all(pushes)

    async def _one(self, ctx: Origin, pushes: list[tuple[Origin, str, p.Push]]) -> None:
        try:
            request = p.decode(ctx.payload, max_payload=self.max_payload)
        except PayloadTooLarge as exc:
            rid = p.peek_request_id(ctx.payload)
            await self._error(ctx, rid, p.ErrorCode.TOO_LARGE, exc.public_message, exc)
            return
        except RemoteProtocolError as exc:
            rid = p.peek_request_id(ctx.payload)
            await self._error(ctx, rid, p.ErrorCode.BAD_REQUEST, exc.public_message, exc)
            return
        rid = getattr(request, "request_id", "")
        if isinstance(request, (p.Push, p.Pull)):
            stream = self._streams.get(ctx.address.value)
            if stream is None:
                await self._error(
                    ctx, rid, p.ErrorCode.NOT_FOUND, f"no stream at address {ctx.address}"
                )
            elif isinstance(request, p.Push):
                pushes.append((ctx, stream, request))
            else:
                await self._start_pull(ctx, stream, request)
            return
        try:
            await self._control(ctx, request)
        except ConfigError as exc:  # a stream name no key can be built from
            await self._error(ctx, rid, p.ErrorCode.BAD_REQUEST, "invalid stream name", exc)
        except REDIS_ERRORS as exc:
            redisconn.checkpoint(exc)
            await self._error(ctx, rid, p.ErrorCode.UNAVAILABLE, REDIS_UNAVAILABLE, exc)

    async def teardown(self) -> None:
        self._waiting.clear()
        for task in list(self._pulls):
            task.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)
        await self._held.aclose()
        if self._hot is not None:
            await self._hot.aclose()
