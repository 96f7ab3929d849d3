"""Stream client: request/reply with the stream service, and Publisher / Consumer workers.

:class:`StreamClient` sends stream-protocol requests as routed messages whose
return route is the owning worker's address, and matches replies by
``request_id`` in the worker's :meth:`~pipeline.routing.node.Worker.intercept`
(so a worker waiting for an answer never waits on its own mailbox). Every
call has a timeout; at most ``max_pending`` calls wait for a routed reply. A
push or pull to the stream service of the client's own node is served in the
calling task instead (:meth:`StreamService.serve_now
<pipeline.streams.service.StreamService.serve_now>`: no routed message, task,
future or codec), the stream transport's round trip; its timeout is checked
by one timer per client (:class:`_Deadlines`), and stopping a consumer
cancels such a pull's Redis wait (:class:`PullAborted`, as for any pull).

:class:`Publisher` pushes what it receives to one stream, many messages per
``Push`` (its mailbox is drained in batches), retrying a failed push with the
same ``request_id`` (idempotent) a bounded number of times.

:class:`Consumer` holds the stream's lease (renewed every third of its TTL),
pulls (a long poll; while a big batch is handled the next pull is already in
flight), hands the entries to its handler (``handler`` per entry or
``batch_handler`` per batch) and saves its index only after the handlers
completed: at-least-once. Saves are grouped (at most every ``save_every_ms``
while busy, at once when idle, and on stop), so a crash re-delivers at most
that much. An entry whose handler failed ``max_failures`` times (or that can
never be handled: malformed, unroutable, too large) goes to the dead-letter
stream with the reason, so one bad entry never blocks the stream. A handler
that does not finish within ``handler_timeout_s`` counts as failed (the
lease is renewed while the consumer waits for it), so a hanging handler
delays the stream by at most ``max_failures`` times that, never forever.
An entry that kills the process is caught too: sessions that start without
progress are counted in Redis (``Attempts``), and after ``max_failures`` of
them the consumer handles the next batch one entry at a time, each counted
before its handler runs, so the killer is dead-lettered after
``max_failures`` more deaths instead of crash-looping the process. On stop it abandons the
pull in flight, finishes the current batch, saves its index and releases the
lease.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pipeline.errors import (
    LeaseHeld,
    LocalProtocolError,
    PayloadTooLarge,
    PullAborted,
    RemoteProtocolError,
    RoutingError,
    SluiceError,
    StreamError,
    StreamNotFound,
)
from pipeline.loggate import LogGate
from pipeline.routing.message import Address, Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker, WorkerContext
from pipeline.streams import protocol as p

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A consumer's handler: gets (index, data); returns None when done, or a
#: future that completes when the entry was handled. Raising = a failure.
Handler = Callable[[str, bytes], Awaitable["asyncio.Future[None] | None"]]

#: Stream routes a client keeps built (see StreamClient._route_to).
MAX_ROUTES = 1024

#: A pull answer at least this long makes the consumer pull again before handling it.
PREFETCH_AT = 64

#: A consumer's batch handler: gets the entries, returns one outcome per entry:
#: None (handled), a future that completes when it is handled, or the exception
#: that made it fail.
BatchHandler = Callable[[list[tuple[str, bytes]]], Awaitable[list[Any]]]

#: Errors no retry can fix: the entry goes to the dead-letter stream at once.
PERMANENT = (RemoteProtocolError, RoutingError, PayloadTooLarge)


def _id_key(index: str) -> tuple[int, int]:
    """Order of Redis entry ids ("ms-seq"); anything else sorts first."""
    ms, _, seq = index.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq.isdigit() or not seq) else (-1, -1)


def new_request_id() -> str:
    return os.urandom(12).hex()


#: Bytes a push adds to its entries when encoded: per entry, and once (request id, headers).
PUSH_ENTRY_OVERHEAD = 5
PUSH_OVERHEAD = 64


def split_pushes(data: list[bytes], max_bytes: int) -> list[list[bytes]]:
    """``data`` in order, cut into pushes that each encode to at most ``max_bytes``
    (an entry too large alone is a push of its own, which the service refuses)."""
    if PUSH_OVERHEAD + sum(map(len, data)) + PUSH_ENTRY_OVERHEAD * len(data) <= max_bytes:
        return [data] if data else []  # the usual case, without a loop in Python
    chunks: list[list[bytes]] = []
    chunk: list[bytes] = []
    size = PUSH_OVERHEAD
    for item in data:
        grown = size + len(item) + PUSH_ENTRY_OVERHEAD
        if chunk and grown > max_bytes:
            chunks.append(chunk)
            chunk, grown = [], PUSH_OVERHEAD + len(item) + PUSH_ENTRY_OVERHEAD
        chunk.append(item)
        size = grown
    if chunk:
        chunks.append(chunk)
    return chunks


def _wake(waiter: asyncio.Future[None], *_: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Deadlines:
    """Deadlines of the calls on a client's hot path, all checked by one timer.

    Each guarded block keeps ``asyncio.timeout``'s contract on a coarser clock:
    at most :data:`TICK_S` after its deadline the task is cancelled, and that
    cancellation leaves the block as ``TimeoutError``; any other cancellation
    passes through. Why not a timer per call: ``asyncio.timeout`` or
    ``call_later`` costs about 4 us per call on Python 3.11 here (four calls per
    stream-transport round trip); adding to a set costs a tenth of that. The
    timer runs only while calls are guarded.
    """

    TICK_S = 0.25

    def __init__(self) -> None:
        self.calls: set[_Call] = set()
        self._timer: asyncio.TimerHandle | None = None

    def guard(self, delay: float) -> _Call:
        """A context manager bounding its block to ``delay`` seconds (entering it gives
        the task it guards)."""
        task = asyncio.current_task()
        if task is None:
            raise LocalProtocolError("a stream client call runs in a task")
        loop = asyncio.get_running_loop()
        call = _Call(self, task, loop.time() + delay)
        if self._timer is None:
            self._timer = loop.call_later(self.TICK_S, self._check)
        return call

    def _check(self) -> None:
        now = asyncio.get_running_loop().time()
        for call in self.calls:
            if not call.expired and call.deadline <= now:
                call.expired = True
                call.task.cancel()
        self._timer = None
        if self.calls:
            self._timer = asyncio.get_running_loop().call_later(self.TICK_S, self._check)


class _Call:
    """One guarded block of :class:`_Deadlines`."""

    __slots__ = ("cancelling", "deadline", "expired", "owner", "task")

    def __init__(self, owner: _Deadlines, task: asyncio.Task[Any], deadline: float) -> None:
        self.owner = owner
        self.task = task
        self.deadline = deadline
        self.cancelling = task.cancelling()
        self.expired = False

    def __enter__(self) -> asyncio.Task[Any]:
        self.owner.calls.add(self)
        return self.task

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.owner.calls.discard(self)
        if (
            self.expired
            and self.task.uncancel() <= self.cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc


def _fail_with(future: asyncio.Future[Any], done: asyncio.Future[None]) -> None:
    """Fail a pending call at once when its request could not be routed or handled."""
    if done.cancelled() or future.done():
        return
    error = done.exception()
    if error is not None:
        future.set_exception(error)


class StreamClient:
    """Correlates stream-protocol requests and replies for one worker address."""

    def __init__(
        self,
        node: Node,
        address: Address,
        *,
        service: str = "stream_service",
        timeout_s: float = 5.0,
        max_pending: int = 256,
    ) -> None:
        self.node = node
        self.address = address
        #: The return route of every request (built once: a Route checks its addresses).
        self._back = Route([address])
        self.service = Route([service])
        self._deadlines = _Deadlines()
        #: Routes to the stream addresses this client pushes to and pulls from.
        self._routes: dict[str, Route] = {}
        self._service_name = service.encode()
        self._service_prefix = self._service_name + b":"
        self.timeout_s = timeout_s
        self._pending: dict[str, asyncio.Future[p.StreamMessage]] = {}
        self._pulls: set[str] = set()
        #: Pulls the service serves in the calling task (serve_now), and how many times
        #: abort_pulls cancelled each.
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._aborted: dict[str, int] = {}
        self._slots = asyncio.Semaphore(max_pending)

    def _route_to(self, stream_address: str) -> Route:
        """``Route([stream_address])``, built once per address (a Route checks its hops)."""
        route = self._routes.get(stream_address)
        if route is None:
            if len(self._routes) >= MAX_ROUTES:
                self._routes.clear()
            route = self._routes[stream_address] = Route([stream_address])
        return route

    def abort_pulls(self) -> None:
        """Make the pulls in flight fail at once with :class:`PullAborted` (on stop)."""
        for rid in self._pulls:
            future = self._pending.get(rid)
            if future is not None and not future.done():
                future.set_exception(PullAborted("pull aborted: the consumer is stopping"))
        # A pull served in its caller's task waits on Redis there: cancel that wait
        # (pull() turns these cancellations, and only these, into PullAborted).
        for rid in self._running:
            if rid not in self._aborted:
                self._aborted[rid] = 0
                self._cancel_pull(rid)

    def _cancel_pull(self, rid: str) -> None:
        """Cancel the task of a running pull, again every 20 ms while it still runs:
        redis-py may swallow a cancellation that lands while it sends a command (then
        the long poll would run its course)."""
        task = self._running.get(rid)
        if task is None or rid not in self._aborted:
            return
        self._aborted[rid] += 1
        task.cancel()
        asyncio.get_running_loop().call_later(0.02, self._cancel_pull, rid)

    def _took_abort(self, rid: str) -> bool:
        """Was pull ``rid`` aborted by :meth:`abort_pulls`? Takes back its cancellations."""
        cancels = self._aborted.pop(rid, None)
        if cancels is None:
            return False
        task = asyncio.current_task()
        if task is not None:
            for _ in range(cancels):
                task.uncancel()
            if task.cancelling() > 0:
                raise asyncio.CancelledError  # cancelled by someone else too: that one wins
        return True

    def intercept(self, message: TransportMessage) -> bool:
        """Resolve a pending call with this reply; False if it is not from the service."""
        if not self._from_service(message):
            return False  # an application message: the worker's mailbox gets it
        try:
            reply = p.decode(message.payload, max_payload=self.node.max_payload + 4096)
        except RemoteProtocolError as exc:
            self.node.counters["stream_client.bad_replies"] += 1
            log.error("%s: malformed reply from the stream service: %s", self.address, exc)
            return True
        future = self._pending.get(getattr(reply, "request_id", ""))
        if future is None or not p.is_reply(reply):
            self.node.counters["stream_client.late_replies"] += 1
            log.warning("%s: %s to no pending request", self.address, type(reply).__name__)
            return True
        if not future.done():
            future.set_result(reply)
        return True

    def _from_service(self, message: TransportMessage) -> bool:
        """Sent by the stream service (its address or one of its stream addresses)?"""
        ret = message.return_route
        return bool(ret) and ret[0].type == 0 and self._for_service(ret[0].value)

    def _for_service(self, value: bytes) -> bool:
        """The service's local address, or one of its stream addresses?"""
        return value == self._service_name or value.startswith(self._service_prefix)

    async def call(
        self,
        route: Route,
        request: p.StreamMessage,
        expect: type[T],
        timeout_s: float | None = None,
    ) -> T:
        rid: str = getattr(request, "request_id")  # noqa: B009 - every request has one
        reply = await self._now(route, request, timeout_s or self.timeout_s)
        if reply is None:
            reply = await self._routed(route, request, rid, timeout_s or self.timeout_s)
        if isinstance(reply, p.Error):
            raise reply.exception()
        if not isinstance(reply, expect):
            raise RemoteProtocolError(
                f"stream service answered {type(request).__name__} with {type(reply).__name__}"
            )
        return reply

    async def _now(
        self, route: Route, request: p.StreamMessage, timeout_s: float
    ) -> p.StreamMessage | None:
        """A push or pull served in this task by the service on this node, or None.

        :meth:`StreamService.serve_now`: no future, no task, no codec, no mailbox
        (the stream transport's hot path). None when the request is not a push or
        pull to a stream address of this node's service, might not fit the limits
        the codec checks, or the service cannot serve it so now: it then goes the
        way of every other request (:meth:`_routed`).
        """
        if not isinstance(request, (p.Push, p.Pull)) or len(route) != 1:
            return None
        if not route[0].value.startswith(self._service_prefix):
            return None
        back = self._back
        rid = request.request_id
        pull = isinstance(request, p.Pull)
        try:
            with self._deadlines.guard(timeout_s) as task:
                if pull:
                    self._running[rid] = task
                try:
                    reply = await self.node.call_inline(route, back, request, p.encode)
                finally:
                    if pull:
                        del self._running[rid]
        except TimeoutError as exc:
            raise StreamError(
                f"stream service did not answer {type(request).__name__} in time"
            ) from exc
        if reply is None:
            return None
        if not isinstance(reply, p.StreamMessage):
            raise RemoteProtocolError(f"stream service answered inline with {type(reply).__name__}")
        return reply

    async def _routed(
        self, route: Route, request: p.StreamMessage, rid: str, timeout_s: float
    ) -> p.StreamMessage:
        """Send ``request`` through the node (:meth:`Node.deliver_tracked`) and wait for the reply."""
        async with self._slots:
            future: asyncio.Future[p.StreamMessage] = asyncio.get_running_loop().create_future()
            self._pending[rid] = future
            try:
                async with asyncio.timeout(timeout_s):
                    sent = await self.node.deliver_tracked(
                        TransportMessage(route, self._back, p.encode(request))
                    )
                    sent.add_done_callback(lambda done: _fail_with(future, done))
                    reply = await future
            except TimeoutError as exc:
                raise StreamError(
                    f"stream service did not answer {type(request).__name__} in time"
                ) from exc
            finally:
                self._pending.pop(rid, None)
        return reply

    async def create(self, name: str) -> p.Init:
        return await self.call(
            self.service, p.CreateStream(request_id=new_request_id(), name=name), p.Init
        )

    async def push(self, stream_address: str, data: list[bytes], request_id: str) -> p.PushConfirm:
        req = p.Push(request_id=request_id, data=tuple(data))
        return await self.call(self._route_to(stream_address), req, p.PushConfirm)

    async def pull(self, stream_address: str, index: str, limit: int, wait_ms: int) -> p.Messages:
        req = p.Pull(request_id=new_request_id(), index=index, limit=limit, wait_ms=wait_ms)
        timeout = self.timeout_s + wait_ms / 1000
        rid = req.request_id
        self._pulls.add(rid)
        try:
            reply = await self.call(self._route_to(stream_address), req, p.Messages, timeout)
        except BaseException:
            if self._took_abort(rid):
                raise PullAborted("pull aborted: the consumer is stopping") from None
            raise
        finally:
            self._pulls.discard(rid)
        if self._took_abort(rid):  # aborted, but Redis answered first
            raise PullAborted("pull aborted: the consumer is stopping")
        return reply

    async def get_index(self, client_id: str, stream: str) -> str:
        req = p.GetIndex(request_id=new_request_id(), client_id=client_id, stream=stream)
        return (await self.call(self.service, req, p.Index)).index

    async def save_index(self, client_id: str, stream: str, index: str) -> str:
        req = p.SaveIndex(
            request_id=new_request_id(), client_id=client_id, stream=stream, index=index
        )
        return (await self.call(self.service, req, p.Index)).index

    async def lease(self, stream: str, holder: str, ttl_ms: int) -> None:
        req = p.Lease(request_id=new_request_id(), stream=stream, holder=holder, ttl_ms=ttl_ms)
        await self.call(self.service, req, p.Ok)

    async def release(self, stream: str, holder: str) -> None:
        req = p.Release(request_id=new_request_id(), stream=stream, holder=holder)
        await self.call(self.service, req, p.Ok)

    async def attempts(self, stream: str, key: str, op: str) -> int:
        """Add one to (``INCR``) or forget (``CLEAR``) a crash counter; the new count."""
        req = p.Attempts(request_id=new_request_id(), stream=stream, key=key, op=op)
        return int((await self.call(self.service, req, p.Index)).index or 0)

    async def dead_letter(self, stream: str, index: str, data: bytes, reason: str) -> None:
        req = p.DeadLetter(
            request_id=new_request_id(), stream=stream, index=index, data=data, reason=reason[:500]
        )
        await self.call(self.service, req, p.Ok)


#: Seconds a push is retried (Redis away or refusing writes) before its sender is told.
DEFAULT_SEND_TIMEOUT_S = 45.0


class StreamPusher:
    """Pushes batches to one stream with idempotent retries (used by Publisher and the transport).

    A push that fails for a reason a retry can cure (the service answered "redis
    unavailable": Redis away, failing over or refusing writes; no answer in time) is
    retried with the same request id, backing off up to ``backoff_max_s``, until its
    deadline; then :class:`StreamError` reaches the sender (counted as
    ``stream_client.push_failures``). An outage is logged once when it starts and once
    when it ends, not per attempt.
    """

    def __init__(
        self,
        client: StreamClient,
        stream: str,
        *,
        timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        backoff_max_s: float = 1.0,
    ) -> None:
        self.client = client
        self.stream = stream
        self.timeout_s = timeout_s
        self.backoff_max_s = backoff_max_s
        self._address: str | None = None
        #: A run of failed attempts: logged when it starts, every 10 s, and when it ends.
        self._gate = LogGate(log)

    async def ensure(self) -> str:
        if self._address is None:
            self._address = (await self.client.create(self.stream)).address
        return self._address

    async def push(self, data: list[bytes], *, deadline: float | None = None) -> p.PushConfirm:
        """Push ``data`` as one request, retried with the same request id until ``deadline``
        (a ``time.monotonic()`` value; default ``timeout_s`` from now)."""
        rid = new_request_id()
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        delay = 0.05
        attempts = 0
        counters = self.client.node.counters
        while True:
            attempts += 1
            try:
                address = await self.ensure()
                confirm = await self.client.push(address, data, rid)
            except StreamNotFound:
                self._address = None  # the service lost the stream's address: create again
                last: SluiceError = StreamNotFound(f"stream {self.stream!r} not found")
            except PERMANENT:
                raise
            except StreamError as exc:
                last = exc
            else:
                self._gate.ended("push", "push to %s works again", self.stream)
                return confirm
            left = deadline - time.monotonic()
            if left <= 0:
                counters["stream_client.push_failures"] += 1
                raise StreamError(
                    f"push to {self.stream!r} failed until its deadline "
                    f"({attempts} attempt(s)): {last}"
                )
            counters["stream_client.push_retries"] += 1
            self._gate.failed(
                "push", "push to %s failing (%s); retrying until its deadline", self.stream, last
            )
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, self.backoff_max_s)


class Publisher(Worker):
    """Publishes the payload of every message it receives to ``stream``."""

    mailbox_size = 8192
    batch_size = 1000

    def __init__(
        self,
        stream: str,
        *,
        service: str = "stream_service",
        timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        self.stream = stream
        self.service = service
        #: Seconds each push is retried before the sender is told (:class:`StreamPusher`).
        self.timeout_s = timeout_s
        self._client: StreamClient | None = None
        self._pusher: StreamPusher | None = None

    async def setup(self, wctx: WorkerContext) -> None:
        self._client = StreamClient(wctx.node, wctx.address, service=self.service)
        self._pusher = StreamPusher(self._client, self.stream, timeout_s=self.timeout_s)

    def intercept(self, message: TransportMessage) -> bool:
        return self._client is not None and self._client.intercept(message)

    def encode(self, ctx: Context) -> bytes:
        """What goes into the stream for one received message."""
        return ctx.payload

    async def handle(self, ctx: Context) -> None:
        await self.handle_batch([ctx])

    async def handle_batch(self, batch: list[Context]) -> None:
        assert self._pusher is not None
        node = batch[0].node
        data = [self.encode(ctx) for ctx in batch]
        for chunk in split_pushes(data, node.max_payload):  # each push fits the node's limit
            confirm = await self._pusher.push(chunk)
            self.counters_add(node, len(confirm.indexes))

    def counters_add(self, node: Node, n: int) -> None:
        node.counters[f"publisher.{self.stream}.pushed"] += n


class Consumer(Worker):
    """Consumes ``stream`` from its saved index, at-least-once, holding the stream's lease."""

    mailbox_size = 64

    def __init__(
        self,
        stream: str,
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        client_id: str,
        holder: str,
        max_failures: int = 3,
        batch: int = 1000,
        wait_ms: int = 500,
        lease_ttl_ms: int = 15_000,
        service: str = "stream_service",
        backoff_max_s: float = 2.0,
        save_every_ms: int = 100,
        handler_timeout_s: float = 60.0,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise LocalProtocolError("a consumer needs exactly one of handler, batch_handler")
        self.stream = stream
        self.handler = handler
        self.batch_handler = batch_handler
        self.client_id = client_id
        self.holder = holder
        self.max_failures = max(1, max_failures)
        self.batch = batch
        self.wait_ms = min(wait_ms, max(50, lease_ttl_ms // 3))
        self.lease_ttl_ms = lease_ttl_ms
        self.service = service
        self.backoff_max_s = backoff_max_s
        self.save_every_ms = save_every_ms
        self.handler_timeout_s = handler_timeout_s
        self._renewed = 0.0
        self._marker: str | None = None
        #: Handled up to here (in memory) / saved up to here (in Redis).
        self.index = ""
        self.saved = ""
        self._saved_at = 0.0
        self.ready = asyncio.Event()
        self.refused: LeaseHeld | None = None
        self._stop = asyncio.Event()
        self._client: StreamClient | None = None
        self._node: Node | None = None
        self._has_lease = False
        #: Retried session failures by class: one line per interval, one when they end.
        self._gate = LogGate(log, level=logging.ERROR)

    async def setup(self, wctx: WorkerContext) -> None:
        self._node = wctx.node
        self._client = StreamClient(wctx.node, wctx.address, service=self.service)

    def intercept(self, message: TransportMessage) -> bool:
        return self._client is not None and self._client.intercept(message)

    async def handle(self, ctx: Context) -> None:
        assert self._node is not None
        self._node.counters["consumer.unexpected_messages"] += 1
        log.warning("consumer %s: unexpected message %r", self.stream, ctx.message)

    def stopping(self) -> None:
        self._stop.set()
        if self._client is not None:
            self._client.abort_pulls()  # interrupt the long poll

    def _count(self, what: str, n: int = 1) -> None:
        assert self._node is not None
        self._node.counters[f"consumer.{what}"] += n

    async def run(self, wctx: WorkerContext) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                await self._session()
                delay = 0.05
            except LeaseHeld as exc:
                self.refused = exc
                self._has_lease = False
                self._count("lease_refused")
                log.error("consumer %s: %s", self.stream, exc)
            except StreamNotFound as exc:
                self._count("stream_missing")
                log.error("consumer %s: stream vanished, creating it again: %s", self.stream, exc)
            except SluiceError as exc:  # Redis down, service timeout, bad reply: retry
                self._count("errors")
                self._gate.failed(type(exc).__name__, "consumer %s: %s; retrying", self.stream, exc)
            except Exception:  # a bug: logged with its traceback and counted; the stream goes on
                self._count("crashes")
                log.exception("consumer %s: session failed; retrying in %.2fs", self.stream, delay)
            else:
                continue
            await self._sleep(delay)
            delay = min(delay * 2, self.backoff_max_s)
        await self._finish()

    async def _sleep(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        except TimeoutError:
            pass

    def _save_due(self, *, force: bool = False) -> bool:
        if self.index == self.saved or self.index == "0-0":
            return False
        return force or time.monotonic() - self._saved_at >= self.save_every_ms / 1000

    async def _save(self, *, force: bool = False) -> None:
        """Save the index of what was handled, at most every ``save_every_ms`` unless forced."""
        assert self._client is not None
        if not self._save_due(force=force):
            return
        now = time.monotonic()
        self.saved = await self._client.save_index(self.client_id, self.stream, self.index)
        self._saved_at = now

    async def _finish(self) -> None:
        if self._has_lease and self._client is not None:
            try:
                await self._save(force=True)
                await self._clear_marker()  # a graceful stop is not a crash
            except (StreamError, RemoteProtocolError) as exc:
                self._count("errors")
                log.error(
                    "consumer %s: index %s not saved on stop: %s", self.stream, self.index, exc
                )
        if self._has_lease and self._client is not None:
            try:
                await self._client.release(self.stream, self.holder)
            except (StreamError, RemoteProtocolError) as exc:
                log.warning("consumer %s: lease not released: %s", self.stream, exc)
            self._has_lease = False

    async def _session(self) -> None:
        client = self._client
        assert client is not None
        await client.lease(self.stream, self.holder, self.lease_ttl_ms)
        self._has_lease = True
        self.refused = None
        self._renewed = time.monotonic()
        address = (await client.create(self.stream)).address
        saved = await client.get_index(self.client_id, self.stream)
        self.saved = saved
        # What this process already handled (and may not have saved yet) is not handled again.
        self.index = self.index if _id_key(self.index) > _id_key(saved) else saved or "0-0"
        self.ready.set()
        for key in self._gate.open_keys():
            self._gate.ended(key, "consumer %s: session started again", self.stream)
        # Crash guard: sessions that start without the previous one having made
        # progress are counted in Redis. More than max_failures of them mean an
        # entry ahead kills this process: go one entry at a time, counting each.
        marker = f"{self.client_id}:sessions"
        started_at = self.saved
        isolate = await client.attempts(self.stream, marker, p.INCR) > self.max_failures
        self._marker = marker
        if isolate:
            self._count("isolated_sessions")
            log.warning("consumer %s: restarted often without progress; isolating", self.stream)
        # While a big batch is handled (and its index saved) the next pull is
        # already in flight; after a small one, pull afterwards (lower latency).
        pending: asyncio.Future[p.Messages] | None = None
        try:
            while not self._stop.is_set():
                if pending is not None:
                    reply = await pending
                    pending = None
                else:
                    reply = await client.pull(address, self.index, self.batch, self.wait_ms)
                next_index = reply.next_index or self.index
                if len(reply.messages) >= PREFETCH_AT:
                    pending = asyncio.ensure_future(
                        client.pull(address, next_index, self.batch, self.wait_ms)
                    )
                if reply.messages and isolate:
                    await self._process_isolated(list(reply.messages))
                    self._count("handled", len(reply.messages))
                    isolate = False
                elif reply.messages:
                    await self._process(list(reply.messages))
                    self._count("handled", len(reply.messages))
                self.index = next_index
                # Saved after the handlers completed (at-least-once); when idle, at once.
                if self._save_due(force=not reply.messages):
                    await self._save(force=not reply.messages)
                if self._marker is not None and not isolate and self.saved != started_at:
                    await self._clear_marker()  # progress: this session did not crash-loop
                if self._lease_due():
                    await self._keep_lease()
        except PullAborted:
            return  # stopping: what that pull would have got is pulled again next time
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)

    async def _clear_marker(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None and self._client is not None:
            await self._client.attempts(self.stream, marker, p.CLEAR)

    async def _process_isolated(self, entries: list[tuple[str, bytes]]) -> None:
        """One entry at a time, each counted in Redis before its handler runs and its
        index saved after: an entry that killed the process ``max_failures`` times is
        dead-lettered instead of handled again."""
        client = self._client
        assert client is not None
        for index, data in entries:
            key = f"{self.client_id}#{index}"
            tries = await client.attempts(self.stream, key, p.INCR)
            if tries > self.max_failures:
                died = StreamError("the consumer's process died while handling it")
                await self._dead_letter(index, data, died, tries - 1)
            else:
                await self._process([(index, data)])
            self.index = index
            await self._save(force=True)
            await client.attempts(self.stream, key, p.CLEAR)

    def _lease_due(self) -> bool:
        return time.monotonic() - self._renewed > self.lease_ttl_ms / 3000

    async def _keep_lease(self) -> None:
        """Renew the lease if a third of its TTL passed since the last renewal."""
        if self._lease_due():
            assert self._client is not None
            await self._client.lease(self.stream, self.holder, self.lease_ttl_ms)
            self._renewed = time.monotonic()

    async def _wait_handled(self, outcome: asyncio.Future[None], deadline: float) -> None:
        """Wait for a handler's outcome until ``deadline``, renewing the lease meanwhile.

        What ``asyncio.wait([outcome], timeout=...)`` does, without its sets and
        extra callbacks (it ran twice per stream-transport round trip).
        """
        loop = asyncio.get_running_loop()
        while not outcome.done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise StreamError(f"handler did not finish in {self.handler_timeout_s}s")
            waiter: asyncio.Future[None] = loop.create_future()
            wake = functools.partial(_wake, waiter)
            outcome.add_done_callback(wake)
            timer = loop.call_later(min(left, self.lease_ttl_ms / 3000), _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                outcome.remove_done_callback(wake)
            if not outcome.done():
                await self._keep_lease()

    async def _process(self, entries: list[tuple[str, bytes]]) -> None:
        failures: dict[str, int] = {}
        todo = entries
        while todo:
            started = await self._start(todo)
            deadline = time.monotonic() + self.handler_timeout_s
            retry: list[tuple[str, bytes]] = []
            for index, data, outcome in started:
                error = outcome if isinstance(outcome, BaseException) else None
                if isinstance(outcome, asyncio.Future):
                    try:
                        await self._wait_handled(outcome, deadline)
                        outcome.result()
                    except asyncio.CancelledError:
                        if self._cancelling():
                            raise
                        error = StreamError("handler was cancelled")
                    except Exception as exc:  # noqa: BLE001 - same: counted below, never hidden
                        error = exc
                if error is None:
                    continue
                failures[index] = failures.get(index, 0) + 1
                self._count("handler_failures")
                if isinstance(error, PERMANENT) or failures[index] >= self.max_failures:
                    await self._dead_letter(index, data, error, failures[index])
                else:
                    retry.append((index, data))
            todo = retry

    async def _start(self, todo: list[tuple[str, bytes]]) -> list[tuple[str, bytes, Any]]:
        """Hand entries to the handler; (index, data, outcome) for each."""
        if self.batch_handler is not None:
            try:
                outcomes = await self.batch_handler(todo)
            except Exception as exc:  # noqa: BLE001 - the application's code: every entry failed, retried
                outcomes = [exc] * len(todo)
            return [(i, d, o) for (i, d), o in zip(todo, outcomes, strict=True)]
        assert self.handler is not None
        started: list[tuple[str, bytes, Any]] = []
        for index, data in todo:
            try:
                started.append((index, data, await self.handler(index, data)))
            except Exception as exc:  # noqa: BLE001 - the application's handler: counted, retried, dead-lettered
                started.append((index, data, exc))
        return started

    @staticmethod
    def _cancelling() -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _dead_letter(self, index: str, data: bytes, error: BaseException, tries: int) -> None:
        assert self._client is not None
        reason = f"{type(error).__name__}: {error} (after {tries} attempt(s))"
        log.error("consumer %s: entry %s dead-lettered: %s", self.stream, index, reason)
        await self._client.dead_letter(self.stream, index, data, reason)
        self._count("dead_lettered")
