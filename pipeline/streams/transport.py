"""The stream transport (seed 001): address type 2 carried over the stream protocol.

A stream address is ``StreamAddress{onward_stream, return_stream}``. On send
the transport pops it from the onward route and prepends the REVERSED address
to the return route, so the receiver's reply goes back through the return
stream::

    in:   onward [Stream{b, a}, B]   return [A]
    push: onward [B]                 return [Stream{a, b}, A]   (to stream b)

It creates the onward stream, subscribes to the return stream (a
:class:`~pipeline.streams.consumer.Consumer` at ``consumer:<stream>``) on first
send, and pushes the wire-encoded message (the same codec as TCP) through the
stream service with return route ``[<node>:transport]``. Sends to one stream
are batched into multi-entry pushes (at most ``max_batch`` entries and the
node's ``max_payload`` bytes each); ``send`` returns once the message is in
Redis. A push that fails is retried until the message's deadline (``send_timeout_s``
after ``send`` was called); then ``send`` raises the :class:`StreamError` to the node,
which reports it to the sender (see :meth:`pipeline.routing.node.Node.deliver`).
Subscribed consumers decode each entry and route it on the node
unchanged (the sender already traced the route).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pipeline.errors import LocalProtocolError, RemoteProtocolError, SluiceError, StreamError
from pipeline.routing.message import Address, AddressType, StreamAddress, TransportMessage
from pipeline.routing.node import Context, Node, Worker
from pipeline.streams.client import StreamClient
from pipeline.streams.consumer import Consumer
from pipeline.streams.pusher import (
    DEFAULT_SEND_TIMEOUT_S,
    PUSH_ENTRY_OVERHEAD,
    PUSH_OVERHEAD,
    StreamPusher,
)

log = logging.getLogger(__name__)


class _ReplyWorker(Worker):
    """The transport's local address: receives the stream service's replies."""

    mailbox_size = 16

    def __init__(self, client: StreamClient) -> None:
        self.client = client

    def intercept(self, message: TransportMessage) -> bool:
        return self.client.intercept(message)

    async def handle(self, ctx: Context) -> None:
        ctx.node.counters["stream_transport.unexpected_messages"] += 1
        log.warning("stream transport: unexpected message %r", ctx.message)


#: A queued message: its encoded bytes, its sender's future, its deadline (monotonic).
_Item = tuple[bytes, asyncio.Future[None], float]


class _Batcher:
    """Queues encoded messages for one stream and pushes them many at a time: at most
    ``max_batch`` per push, and at most ``max_bytes`` once encoded (the node's limit),
    so messages that fit one by one never fail for being sent together. A batch is
    retried until the earliest deadline among its messages."""

    def __init__(
        self, pusher: StreamPusher, *, max_batch: int, max_queue: int, max_bytes: int
    ) -> None:
        self.pusher = pusher
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(max_queue)
        #: Taken from the queue but left for the next push (it did not fit this one).
        self._carry: _Item | None = None
        self.busy = False
        self.task = asyncio.create_task(self._loop(), name=f"push:{pusher.stream}")

    async def submit(self, data: bytes, deadline: float) -> None:
        if not self.busy and self.queue.empty():
            # Nothing to batch with: push from the caller's task (saves two loop hops).
            self.busy = True
            try:
                await self.pusher.push([data], deadline=deadline)
            finally:
                self.busy = False
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self.queue.put((data, done, deadline))
        await done

    async def _loop(self) -> None:
        while True:
            first, self._carry = self._carry or await self.queue.get(), None
            items = [first]
            size = PUSH_OVERHEAD + len(first[0]) + PUSH_ENTRY_OVERHEAD
            deadline = first[2]
            while len(items) < self.max_batch and not self.queue.empty():
                item = self.queue.get_nowait()
                size += len(item[0]) + PUSH_ENTRY_OVERHEAD
                if size > self.max_bytes:
                    self._carry = item
                    break
                items.append(item)
                deadline = min(deadline, item[2])
            try:
                await self.pusher.push([data for data, _, _ in items], deadline=deadline)
            except SluiceError as exc:  # any failure of this batch fails its senders, not the loop
                for _, done, _ in items:
                    if not done.done():
                        done.set_exception(exc)
            except asyncio.CancelledError:
                for _, done, _ in items:
                    done.cancel()
                raise
            else:
                for _, done, _ in items:
                    if not done.done():
                        done.set_result(None)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if self._carry is not None:
            self._carry[1].cancel()
            self._carry = None
        while not self.queue.empty():
            self.queue.get_nowait()[1].cancel()


class StreamTransport:
    """Transport for address type 2 (see the module docstring)."""

    address_type = int(AddressType.STREAM)

    def __init__(
        self,
        *,
        service: str = "stream_service",
        max_failures: int = 3,
        lease_ttl_ms: int = 15_000,
        max_streams: int = 1000,
        max_batch: int = 1000,
        max_queue: int = 10_000,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        self.service = service
        self.send_timeout_s = send_timeout_s
        self.max_failures = max_failures
        self.lease_ttl_ms = lease_ttl_ms
        self.max_streams = max_streams
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.consumers: dict[str, Consumer] = {}
        self._batchers: dict[str, _Batcher] = {}
        #: Parsed stream addresses and their reverse (the same few, over and over).
        self._parsed: dict[Address, tuple[StreamAddress, Address]] = {}
        self._lock = asyncio.Lock()
        self._node: Node | None = None
        self._client: StreamClient | None = None
        self.name = "transport"

    @property
    def node(self) -> Node:
        if self._node is None:
            raise LocalProtocolError("stream transport is not started")
        return self._node

    async def start(self, node: Node) -> None:
        self._node = node
        self.name = f"{node.name}:transport"
        self._client = StreamClient(node, Address.local(self.name), service=self.service)
        await node.add_worker(self.name, _ReplyWorker(self._client))

    async def subscribe(self, stream: str) -> Consumer:
        """Consume ``stream`` into this node (idempotent)."""
        found = self.consumers.get(stream)
        if found is not None:
            return found
        async with self._lock:
            found = self.consumers.get(stream)
            if found is None:
                if len(self.consumers) >= self.max_streams:
                    raise StreamError(f"more than {self.max_streams} subscriptions")
                node = self.node
                found = Consumer(
                    stream,
                    batch_handler=self._handle_entries,
                    client_id=node.name,
                    holder=node.name,
                    max_failures=self.max_failures,
                    lease_ttl_ms=self.lease_ttl_ms,
                    service=self.service,
                )
                await node.add_worker(f"consumer:{stream}", found)
                self.consumers[stream] = found
        return found

    async def _handle_entries(self, entries: list[tuple[str, bytes]]) -> list[Any]:
        """Decode each entry and route it on the node unchanged (the sender traced it)."""
        node = self.node
        outcomes: list[Any] = []
        for index, data in entries:
            try:
                message = TransportMessage.decode(data, max_payload=node.max_payload)
            except RemoteProtocolError as exc:
                node.counters["stream_transport.malformed"] += 1
                outcomes.append(RemoteProtocolError(f"entry {index}: {exc}"))
                continue
            done, pending = node.route_tracked(message)
            if pending is not None:
                await pending
            outcomes.append(done)
        return outcomes

    def _batcher(self, stream: str) -> _Batcher:
        batcher = self._batchers.get(stream)
        if batcher is None:
            if len(self._batchers) >= self.max_streams:
                raise StreamError(f"more than {self.max_streams} onward streams")
            assert self._client is not None
            pusher = StreamPusher(self._client, stream, timeout_s=self.send_timeout_s)
            batcher = _Batcher(
                pusher,
                max_batch=self.max_batch,
                max_queue=self.max_queue,
                max_bytes=self.node.max_payload,
            )
            self._batchers[stream] = batcher
        return batcher

    async def send(self, message: TransportMessage) -> None:
        deadline = time.monotonic() + self.send_timeout_s
        first = message.onward_route.first
        pair = self._parsed.get(first)
        if pair is None:
            try:
                address = StreamAddress.from_address(first)
            except RemoteProtocolError as exc:
                self.node.counters["stream_transport.bad_address"] += 1
                raise RemoteProtocolError(f"stream transport: {exc}") from exc
            if len(self._parsed) >= 4096:
                self._parsed.clear()
            pair = self._parsed[first] = (address, address.reversed().to_address())
        address, back = pair
        forwarded = TransportMessage(
            message.onward_route.rest(), message.return_route.prepend(back), message.payload
        )
        if address.return_stream not in self.consumers:
            await self.subscribe(address.return_stream)
        await self._batcher(address.onward_stream).submit(forwarded.encode(), deadline)

    async def stop(self) -> None:
        batchers, self._batchers = list(self._batchers.values()), {}
        for batcher in batchers:
            await batcher.stop()
