"""The stream client: request/reply with the stream service, for one worker address.

:class:`StreamClient` sends stream-protocol requests as routed messages whose
return route is the owning worker's address, and matches replies by
``request_id`` in the worker's :meth:`~pipeline.routing.node.Worker.intercept`
(so a worker waiting for an answer never waits on its own mailbox). Every
call has a timeout; at most ``max_pending`` calls wait for a routed reply. A
push or pull to the stream service of the client's own node is served in the
calling task instead (:meth:`StreamService.serve_now
<pipeline.streams.service.StreamService.serve_now>`: no routed message, task,
future or codec), the stream transport's round trip; its timeout is checked
by one timer per client (:class:`~pipeline.streams.deadlines.Deadlines`), and
stopping a consumer cancels such a pull's Redis wait (:class:`PullAborted`, as
for any pull).

The workers built on it have their own modules: the pusher
(:mod:`pipeline.streams.pusher`), the publisher (:mod:`pipeline.streams.publisher`)
and the consumer (:mod:`pipeline.streams.consumer`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, TypeVar

from pipeline.errors import (
    PayloadTooLarge,
    PullAborted,
    RemoteProtocolError,
    RoutingError,
    StreamError,
)
from pipeline.routing.message import Address, Route, TransportMessage
from pipeline.routing.node import Node
from pipeline.streams import protocol as p
from pipeline.streams.deadlines import Deadlines

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Stream routes a client keeps built (see StreamClient._route_to).
MAX_ROUTES = 1024

#: Errors no retry can fix: the entry goes to the dead-letter stream at once.
PERMANENT = (RemoteProtocolError, RoutingError, PayloadTooLarge)


def new_request_id() -> str:
    return os.urandom(12).hex()


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
        self._deadlines = Deadlines()
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
