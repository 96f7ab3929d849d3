"""The stream service worker: the stream protocol (see ``protocol.py``) on Redis Streams.

Run one per node at local address ``stream_service``; clients reach it only
through routed messages. ``CreateStream{name}`` gives the stream a local
address on this node (``stream_service:<name>``) that ``Push`` and ``Pull``
are sent to; Redis is the store shared between nodes.

* Push: one Lua script per push (atomic): if ``keys.push_dedup`` exists, the
  first push's indexes are returned (status DUPLICATE); else every entry is
  ``XADD``-ed and the indexes remembered for ``dedup_ttl_ms``. All pushes the
  mailbox holds go to Redis in one pipeline.
* Pull: a long poll. A consumer that is behind gets a Lua ``XRANGE`` that
  Redis packs with cmsgpack (one bulk reply per batch, bounded in bytes, nil
  when the stream is gone); a caught-up one (or an empty fetch) gets
  ``XREAD BLOCK wait_ms`` (bounded by ``max_wait_ms``; an empty answer checks
  the stream still exists). Each pull runs in its own task, or in its
  client's task when the client is on this node (:meth:`StreamService.serve_now`),
  at most ``max_pulls`` at once either way; further pulls wait in a queue of
  ``max_waiting_pulls`` (started as slots free up, answered ``unavailable``
  beyond it), so held long polls never stall a push, even one in the same batch.
* A client on this node has its pushes and pulls served in its own task
  (``serve_now``): the same checks, errors and counters as a routed request,
  without its message, mailbox hop and codec; its other requests are routed.
  The hot commands (a single push, a pull) run on single-connection clients
  of the service's pool held between commands (:class:`_Held`).
* SaveIndex is monotonic (Lua compare of entry ids); GetIndex returns ``""``
  when nothing was saved.
* Leases (``Lease`` / ``Release``) as in ``lease.py``; ``DeadLetter`` appends
  to ``keys.dead_letter``; ``Attempts`` counts in ``keys.failures``.

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
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgpack
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

from pipeline import keys
from pipeline.errors import ConfigError, PayloadTooLarge, RemoteProtocolError, SluiceError
from pipeline.loggate import LogGate
from pipeline.redisio import conn as redisconn
from pipeline.redisio.durability import Durability
from pipeline.routing.message import Address, Route
from pipeline.routing.node import Context, Node, Worker, WorkerContext
from pipeline.streams import protocol as p
from pipeline.streams.lease import Leases

log = logging.getLogger(__name__)

FIELD = b"data"
INDEX_RE = re.compile(r"^\d{1,20}-\d{1,20}$")
DEAD_LETTER_MAXLEN = 100_000
#: Crash counters (``Attempts``) of a stream are forgotten this long after the last one.
ATTEMPTS_TTL_MS = 7 * 24 * 3600 * 1000
#: Most entries one blocking XREAD returns (the fast path is the packed fetch).
BLOCK_COUNT = 64

_PUSH = """
local prev = redis.call('GET', KEYS[2])
if prev then return {0, prev} end
local ids = {}
for i = 3, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', ARGV[2], ARGV[i])
end
local joined = table.concat(ids, ',')
redis.call('SET', KEYS[2], joined, 'PX', ARGV[1])
return {1, joined}
"""

# Non-blocking fetch packed by Redis itself (cmsgpack): one bulk string instead
# of five RESP elements per entry, so the client parses a batch in C. Stops
# after ARGV[4] bytes (but always returns at least one entry). nil = no stream.
_FETCH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
local out = {}
local size = 0
for _, e in ipairs(entries) do
  if #out > 0 and size > tonumber(ARGV[4]) then break end
  local fields = e[2]
  local data = ''
  for j = 1, #fields, 2 do
    if fields[j] == ARGV[3] then data = fields[j + 1]; break end
  end
  out[#out + 1] = e[1]
  out[#out + 1] = data
  size = size + #data
end
return cmsgpack.pack(out)
"""

# One key only (the stream's own slot on a cluster); the registry of stream names
# (``keys.streams_registry``) is updated after it as a separate, idempotent SADD.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local id = redis.call('XADD', KEYS[1], '*', 'init', '')
redis.call('XDEL', KEYS[1], id)
return 1
"""

_SAVE_INDEX = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local cms, cseq = string.match(cur, '^(%d+)-(%d+)$')
  local nms, nseq = string.match(ARGV[2], '^(%d+)-(%d+)$')
  cms = tonumber(cms); cseq = tonumber(cseq); nms = tonumber(nms); nseq = tonumber(nseq)
  if cms and (nms < cms or (nms == cms and nseq <= cseq)) then return cur end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""


#: Public text of every Redis failure sent to a peer (the details go to the log).
REDIS_UNAVAILABLE = "redis unavailable"
#: Seconds between two log lines of "redis unavailable" answers (all are counted).
UNAVAILABLE_LOG_S = 10.0
INTERNAL_ERROR = "internal error"
#: Retried Redis errors: a dropped connection, Redis loading or going away.
_REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, *redisconn.UNAVAILABLE)


def connect(url: str, *, max_connections: int | None = None, block_s: float = 5.0) -> Redis:
    """The stream service's Redis client (:func:`pipeline.redisio.conn.connect`, role STREAM_SERVICE).

    ``block_s`` is the longest ``XREAD BLOCK`` it issues (``max_wait_ms``).
    Retried pushes are safe: a push is idempotent by its request id.
    """
    return redisconn.connect(
        url, redisconn.Role.STREAM_SERVICE, block_s=block_s, max_connections=max_connections
    )


def connect_hot(url: str) -> Redis:
    """The client for the pushes and pulls the service serves in its own node's clients'
    tasks (:meth:`StreamService.serve_now`; role STREAM_HOT, no socket timeout).

    Every command on it runs under the calling client's deadline (a push's or
    pull's timeout), so it needs no socket timeout of its own, whose
    per-command ``asyncio.wait_for`` costs about 20 us (``rtt_p50_ms`` of
    ``make bench B=streams``). Pass it as ``StreamService(redis, hot=...)``,
    which closes it when it stops (``redis`` stays the caller's to close).
    """
    return redisconn.connect(url, redisconn.Role.STREAM_HOT)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


class _Held:
    """Single-connection clients of the service's hot pool, kept between commands (LIFO).

    Why: a command through the role's ``BlockingConnectionPool`` pays its
    condition and wait timeout twice per command (about 15-20 us here), four
    times per stream-transport round trip (``tests/bench/bench_streams.py``,
    ``rtt_p50_ms``); a held client (``Redis.client()``) pays only its lock. The
    connections still come from the pool of ``redis`` (the service's ``hot``
    client, else its own) and count against its size; at most ``max_idle``
    stay held while unused, the others go back to it.
    """

    def __init__(self, redis: Redis, max_idle: int) -> None:
        self.redis = redis
        self.max_idle = max_idle
        self._idle: list[Redis] = []
        self._closed = False
        #: A cluster client has no single-connection clients (each command goes to the
        #: node owning its key), and a Sentinel one's would stay on a dead master after a
        #: failover (see :mod:`pipeline.redisio.ha`): every take is then the client itself.
        self._shared = redisconn.is_cluster(redis) or redisconn.is_sentinel(redis)

    def take(self) -> Redis:
        if self._shared:
            return self.redis
        return self._idle.pop() if self._idle else self.redis.client()

    def keep(self, client: Redis) -> bool:
        """Hold ``client`` for the next take; False: close it (its connection goes back)."""
        if self._shared:
            return True  # the shared client itself: nothing to hold or close
        if len(self._idle) < self.max_idle and not self._closed:
            self._idle.append(client)
            return True
        return False

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for client in idle:
            await client.aclose()


#: Held clients kept while unused (see :class:`_Held`).
HELD_IDLE = 16

#: Where a request came from: a routed message (a client on this node uses
#: :meth:`StreamService.serve_now` or is routed like any other).
_Origin = Context


def _request_id(ctx: _Origin) -> str:
    return p.peek_request_id(ctx.payload)


def _return_route(ctx: _Origin) -> Route:
    return ctx.message.return_route


class StreamService(Worker):
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
        self._waiting: collections.deque[tuple[_Origin, str, p.Pull, str]] = collections.deque()
        self._streams: dict[bytes, str] = {}
        self._keys: dict[str, str] = {}
        #: Streams whose last pull was a full batch (bounded by the number of streams).
        self._busy: set[str] = set()
        self._push_sha: str | None = None
        self._create_script = redis.register_script(_CREATE)
        self._fetch_script = redis.register_script(_FETCH)
        self._save_script = redis.register_script(_SAVE_INDEX)
        self._leases = Leases(redis)
        #: Clients for requests served in a local client's task, under its deadline
        #: (``hot``: see :func:`connect_hot`; else ``redis``, with its socket timeout).
        #: Routed requests have no caller's deadline here: they use ``redis``.
        self._held = _Held(hot if hot is not None else redis, HELD_IDLE)
        self._hot = hot
        self._node: Node | None = None
        self._closing = False
        self.name = "stream_service"
        #: "redis unavailable" answers are logged at most every UNAVAILABLE_LOG_S: when
        #: Redis is away or refuses writes every client retries, each answer counted.
        self._gate = LogGate(log, UNAVAILABLE_LOG_S, level=logging.ERROR)

    async def setup(self, wctx: WorkerContext) -> None:
        self._node = wctx.node
        self.name = wctx.name

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
            log.error("stream service: %s from %s: %s", *args)
        return p.Error(request_id=request_id, code=code, message=text)

    async def _error(
        self,
        ctx: _Origin,
        request_id: str,
        code: p.ErrorCode,
        text: str,
        detail: BaseException | str | None = None,
    ) -> None:
        """Answer with ``text`` (public); ``detail`` (if any) goes only to the log."""
        await self._answer(ctx, self._fail(_return_route(ctx), request_id, code, text, detail))

    async def _answer(self, ctx: _Origin, reply: p.StreamMessage) -> None:
        try:
            await ctx.reply(p.encode(reply))
        except SluiceError as exc:  # its client times out and asks again; the others go on
            self._count("replies_not_sent")
            log.warning("stream service: reply to %s not sent: %s", ctx.message.return_route, exc)

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

    async def handle_batch(self, batch: Sequence[_Origin]) -> None:
        """Every request of the batch is answered, each on its own: pushes go to Redis
        together after the loop, pulls are started (or queued) without waiting."""
        pushes: list[tuple[_Origin, str, p.Push]] = []
        for ctx in batch:
            try:
                await self._one(ctx, pushes)
            except Exception as exc:  # a bug a request triggers must not take the batch down
                self._count("internal_errors")
                log.exception("stream service: request from %s failed", _return_route(ctx))
                rid = _request_id(ctx)
                await self._error(ctx, rid, p.ErrorCode.BAD_REQUEST, INTERNAL_ERROR, exc)
        if pushes:
            await self._push_all(pushes)

    async def _one(self, ctx: _Origin, pushes: list[tuple[_Origin, str, p.Push]]) -> None:
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
        except _REDIS_ERRORS as exc:
            redisconn.checkpoint(exc)
            await self._error(ctx, rid, p.ErrorCode.UNAVAILABLE, REDIS_UNAVAILABLE, exc)

    # --- push ---------------------------------------------------------------

    async def _push_all(self, pushes: list[tuple[_Origin, str, p.Push]]) -> None:
        replies = await self._push_replies(
            [(_return_route(ctx), stream, req) for ctx, stream, req in pushes]
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
        except _REDIS_ERRORS as exc:
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
        indexes = tuple(_text(joined).split(",")) if joined else ()
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
        except _REDIS_ERRORS as exc:
            redisconn.checkpoint(exc)
            return exc
        return result

    async def _run_pushes(
        self, pushes: Sequence[tuple[object, str, p.Push]], *, held: bool = False
    ) -> list[Any]:
        """All pushes in one round trip (EVALSHA of the push script per push); ``held``:
        one push served in a local client's task, on a held client (see ``_held``)."""
        if self._push_sha is None:
            self._push_sha = _text(await self.redis.script_load(_PUSH))
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

    # --- pull ---------------------------------------------------------------

    async def _start_pull(self, ctx: _Origin, stream: str, req: p.Pull) -> None:
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

    def _spawn_pull(self, ctx: _Origin, stream: str, req: p.Pull, index: str) -> None:
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
            log.error("stream service: pull failed: %r", task.exception())
        if not task.cancelled():
            self._start_waiting()

    def _start_waiting(self) -> None:
        """Start the oldest waiting pull if a slot is free."""
        if self._waiting and self._active_pulls() < self.max_pulls:
            self._spawn_pull(*self._waiting.popleft())

    async def _pull(self, ctx: _Origin, stream: str, req: p.Pull, index: str) -> None:
        await self._answer(ctx, await self._pull_reply(_return_route(ctx), stream, req, index))

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
        except _REDIS_ERRORS as exc:
            redisconn.checkpoint(exc)
            code, text = p.ErrorCode.UNAVAILABLE, REDIS_UNAVAILABLE
            return self._fail(origin, req.request_id, code, text, exc)
        except Exception as exc:  # e.g. an entry Redis holds in a shape we did not write
            self._count("internal_errors")
            log.exception("stream service: pull of %s failed", stream)
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
            entry_id = _text(eid)
            size = len(data) + len(entry_id) + 16
            if size > budget:
                reason = f"entry of {len(data)} bytes exceeds the node limit {budget}"
                log.error(
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

    # --- control requests -----------------------------------------------------

    async def _control(self, ctx: _Origin, req: p.StreamMessage) -> None:
        """Answer one control request through :data:`_CONTROL`, keyed by its class.

        A handler returns the reply, or None when it already answered with an
        error. A stream name no key can be built from raises ``ConfigError``,
        which :meth:`_one` answers (``invalid stream name``).
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

    async def _create(self, ctx: _Origin, req: p.CreateStream) -> p.StreamMessage | None:
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

    async def _get_index(self, ctx: _Origin, req: p.GetIndex) -> p.StreamMessage | None:
        current = await self.redis.hget(keys.consumer_index(req.stream), req.client_id)
        return p.Index(
            request_id=req.request_id,
            client_id=req.client_id,
            stream=req.stream,
            index=_text(current),
        )

    async def _save_index(self, ctx: _Origin, req: p.SaveIndex) -> p.StreamMessage | None:
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
            index=_text(current),
        )

    async def _lease(self, ctx: _Origin, req: p.Lease) -> p.StreamMessage | None:
        state = await self._leases.acquire(req.stream, req.holder, req.ttl_ms)
        if not state.granted:
            text = (
                f"stream {req.stream!r} is consumed by {state.holder!r} "
                f"(lease expires in {state.ttl_ms} ms); {req.holder!r} refused"
            )
            await self._error(ctx, req.request_id, p.ErrorCode.LEASE_HELD, text)
            return None
        return p.Ok(request_id=req.request_id)

    async def _release(self, ctx: _Origin, req: p.Release) -> p.StreamMessage | None:
        await self._leases.release(req.stream, req.holder)
        return p.Ok(request_id=req.request_id)

    async def _attempts(self, ctx: _Origin, req: p.Attempts) -> p.StreamMessage | None:
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

    async def _dead_letter(self, ctx: _Origin, req: p.DeadLetter) -> p.StreamMessage | None:
        fields: dict[Any, Any] = {FIELD: req.data, "index": req.index, "reason": req.reason}
        await self.redis.xadd(
            keys.dead_letter(req.stream), fields, maxlen=DEAD_LETTER_MAXLEN, approximate=True
        )
        self._count("dead_lettered")
        return p.Ok(request_id=req.request_id)

    async def teardown(self) -> None:
        self._waiting.clear()
        for task in list(self._pulls):
            task.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)
        await self._held.aclose()
        if self._hot is not None:
            await self._hot.aclose()


_ControlHandler = Callable[[StreamService, _Origin, Any], Awaitable[p.StreamMessage | None]]

#: The control requests (everything but Push and Pull) and their handlers.
_CONTROL: dict[type[Any], _ControlHandler] = {
    p.CreateStream: StreamService._create,
    p.GetIndex: StreamService._get_index,
    p.SaveIndex: StreamService._save_index,
    p.Lease: StreamService._lease,
    p.Release: StreamService._release,
    p.Attempts: StreamService._attempts,
    p.DeadLetter: StreamService._dead_letter,
}
