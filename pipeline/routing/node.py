"""A node: local workers with bounded mailboxes, and transports by address type.

Theory of operation
-------------------
Every message a node routes goes through one path, :meth:`Node.deliver`:

* the onward route is empty, the payload is over ``max_payload``, the first
  hop is a local name with no worker, or a type with no transport: the message
  is dropped with a logged, counted :class:`~pipeline.errors.RoutingError`
  (``UnroutableMessage``, ``UnknownAddressType``, ``PayloadTooLarge``); the
  node never crashes on a bad route;
* the first hop is local (type 0): the message goes into that worker's
  bounded mailbox (``await`` = back-pressure when it is full). A worker may
  first :meth:`Worker.intercept` it synchronously (used for correlated
  replies, so a worker waiting for an answer never deadlocks on its own
  mailbox);
* otherwise the transport registered for ``first.type`` sends it; if it
  cannot (e.g. the stream transport's retries ran out at the message's
  deadline), a worker that sent it (``Context.send`` / ``reply`` /
  ``forward``) gets the transport's error raised: never a silent drop.

:meth:`Node.deliver_tracked` returns a future that completes when the worker's
handler returned (or the transport accepted the message), or fails with the
handler's / routing error: stream consumers save their index only after it,
which is what makes delivery at-least-once.

Transports (the interface other transports, e.g. TCP, build on)::

    class Transport(Protocol):
        address_type: int
        async def start(self, node: Node) -> None      # called by Node.start; a transport
                                                      # registered on a started node must
                                                      # be started by whoever registers it
        async def send(self, message: TransportMessage) -> None
            # message.onward_route[0].type == address_type; raise a SluiceError
            # subclass on failure, once retrying is over (the node counts it and
            # raises it to a sending worker, or logs it: see Node.deliver)
        async def stop(self) -> None

    node.register_transport(t)
    await node.deliver(message)   # a transport hands a received message to its node

Route tracing (see :class:`Context`): ``send`` sets the return route to the
sender's address, ``reply`` answers along the return route, ``forward`` pops
this hop and prepends the address leading back to it.

Shutdown (:meth:`Node.stop`), in order, bounded by a deadline: workers are
asked to stop (``stopping``: consumers stop pulling), their ``run`` loops are
awaited, mailboxes drain, handler tasks end, then transports stop. Safe to
call twice.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from pipeline import lifecycle
from pipeline.errors import (
    LocalProtocolError,
    PayloadTooLarge,
    RoutingError,
    SluiceError,
    UnknownAddressType,
    UnroutableMessage,
)
from pipeline.routing.message import Address, AddressType, Route, TransportMessage

log = logging.getLogger(__name__)

DEFAULT_MAILBOX = 1024
#: Payload bytes a mailbox holds before senders wait (besides its message count).
DEFAULT_MAILBOX_BYTES = 64 << 20
MAX_WORKERS = 10_000


class Transport(Protocol):
    """Carries messages whose first hop has type ``address_type`` to other nodes."""

    address_type: int

    async def start(self, node: Node) -> None: ...

    async def send(self, message: TransportMessage) -> None: ...

    async def stop(self) -> None: ...


class Context:
    """What a worker's handler gets: the message, the address it came to, and the node."""

    __slots__ = ("address", "message", "node")

    def __init__(self, node: Node, address: Address, message: TransportMessage) -> None:
        self.node = node
        self.address = address
        self.message = message

    @property
    def payload(self) -> bytes:
        return self.message.payload

    async def send(
        self,
        onward_route: Iterable[Address | str],
        payload: bytes,
        *,
        return_route: Iterable[Address | str] | None = None,
    ) -> None:
        """Send a new message; replies come back to this worker unless told otherwise."""
        ret = Route([self.address]) if return_route is None else Route(return_route)
        await self.node.deliver(TransportMessage(Route(onward_route), ret, payload), strict=True)

    async def reply(self, payload: bytes) -> None:
        """Answer along the traced return route."""
        await self.node.deliver(
            TransportMessage(self.message.return_route, Route([self.address]), payload),
            strict=True,
        )

    async def forward(
        self,
        onward_route: Iterable[Address | str] | None = None,
        *,
        via: Address | None = None,
        payload: bytes | None = None,
    ) -> None:
        """Pass the message on: pop this hop, prepend ``via`` (default: this address) to the return route."""
        onward = self.message.onward_route.rest() if onward_route is None else Route(onward_route)
        ret = self.message.return_route.prepend(via or self.address)
        body = self.message.payload if payload is None else payload
        await self.node.deliver(TransportMessage(onward, ret, body), strict=True)


class WorkerContext:
    """What a worker's lifecycle hooks get: its node and its main address."""

    __slots__ = ("address", "name", "node")

    def __init__(self, node: Node, name: str) -> None:
        self.node = node
        self.name = name
        self.address = Address.local(name)


class Worker:
    """Base of local workers. Override :meth:`handle` (or :meth:`handle_batch`).

    ``mailbox_size`` bounds the mailbox in messages and ``mailbox_bytes`` in
    payload bytes (a sender waits above either); ``batch_size`` > 1 makes the node hand
    up to that many queued messages at once to :meth:`handle_batch`.
    """

    mailbox_size: int = DEFAULT_MAILBOX
    mailbox_bytes: int = DEFAULT_MAILBOX_BYTES
    batch_size: int = 1

    async def setup(self, wctx: WorkerContext) -> None:
        """Called once when the worker is added, before it gets messages."""

    async def handle(self, ctx: Context) -> None:
        raise NotImplementedError

    async def handle_batch(self, batch: list[Context]) -> None:
        for ctx in batch:
            await self.handle(ctx)

    def intercept(self, message: TransportMessage) -> bool:
        """Synchronous fast path at delivery time; True means consumed (not mailed)."""
        return False

    async def serve_inline(self, address: Address, request: object, origin: Route) -> object | None:
        """Answer ``request`` (a decoded message from a worker on this node, at ``address``)
        in the caller's task, without a message, mailbox or codec (:meth:`Node.call_inline`);
        None: it cannot be served so now, and the caller routes it as any other."""
        return None

    async def run(self, wctx: WorkerContext) -> None:
        """Optional long-running loop (a consumer's pull loop); owned by the node."""

    def stopping(self) -> None:
        """Asked to stop: finish the current step, start nothing new."""

    async def teardown(self) -> None:
        """Called once after the mailbox drained (save state, release leases)."""


_Done = asyncio.Future[None] | None
_Item = tuple[TransportMessage, _Done]


class _Slot:
    __slots__ = ("address", "bytes", "name", "queue", "room", "tasks", "worker")

    def __init__(self, name: str, worker: Worker) -> None:
        self.name = name
        self.address = Address.local(name)
        self.worker = worker
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=max(1, worker.mailbox_size))
        #: Payload bytes queued, and an event set whenever some were taken out.
        self.bytes = 0
        self.room = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []


class Node:
    """Owns local workers and transports; routes every message through :meth:`deliver`."""

    def __init__(self, name: str, *, max_payload: int = 1 << 20, trace_size: int = 0) -> None:
        self.name = name
        self.max_payload = max_payload
        self.counters: collections.Counter[str] = collections.Counter()
        #: The last ``trace_size`` messages routed to local addresses: (address, message).
        self.trace: collections.deque[tuple[Address, TransportMessage]] = collections.deque(
            maxlen=max(0, trace_size)
        )
        self._slots: dict[str, _Slot] = {}
        self._addresses: dict[bytes, _Slot] = {}
        self._transports: dict[int, Transport] = {}
        self._started = False
        self._stopping = False
        self._stopped = False
        self._stopping_once = lifecycle.Once()

    # --- configuration ----------------------------------------------------

    def register_transport(self, transport: Transport) -> None:
        kind = transport.address_type
        if kind == AddressType.LOCAL:
            raise LocalProtocolError("address type 0 is the node itself, not a transport")
        if kind in self._transports:
            raise LocalProtocolError(f"a transport for address type {kind} is registered")
        self._transports[kind] = transport

    def transport(self, address_type: int) -> Transport | None:
        return self._transports.get(address_type)

    async def add_worker(
        self, name: str, worker: Worker, *, aliases: Iterable[str] = ()
    ) -> WorkerContext:
        """Start ``worker`` at local address ``name`` (and ``aliases``)."""
        if self._stopping:
            raise LocalProtocolError(f"node {self.name} is stopping")
        if name in self._slots or name.encode() in self._addresses:
            raise LocalProtocolError(f"address {name!r} is taken on node {self.name}")
        if len(self._addresses) >= MAX_WORKERS:
            raise LocalProtocolError(f"node {self.name} has {MAX_WORKERS} addresses already")
        slot = _Slot(name, worker)
        wctx = WorkerContext(self, name)
        await worker.setup(wctx)
        self._slots[name] = slot
        self._addresses[slot.address.value] = slot
        for alias in aliases:
            self.add_alias(name, alias)
        slot.tasks.append(asyncio.create_task(self._mailbox_loop(slot), name=f"{name}:mailbox"))
        slot.tasks.append(asyncio.create_task(self._run_loop(slot, wctx), name=f"{name}:run"))
        return wctx

    def add_alias(self, name: str, alias: str) -> Address:
        """Give worker ``name`` another local address (idempotent)."""
        slot = self._slots.get(name)
        if slot is None:
            raise LocalProtocolError(f"no worker {name!r} on node {self.name}")
        key = alias.encode()
        owner = self._addresses.get(key)
        if owner is slot:
            return Address.local(alias)
        if owner is not None:
            raise LocalProtocolError(f"address {alias!r} is taken on node {self.name}")
        if len(self._addresses) >= MAX_WORKERS:
            raise LocalProtocolError(f"node {self.name} has {MAX_WORKERS} addresses already")
        self._addresses[key] = slot
        return Address.local(alias)

    def has_address(self, name: str) -> bool:
        return name.encode() in self._addresses

    def worker(self, name: str) -> Worker | None:
        slot = self._slots.get(name)
        return slot.worker if slot else None

    async def remove_worker(self, name: str, *, grace_s: float = 5.0) -> None:
        slot = self._slots.get(name)
        if slot is None:
            return
        await self._stop_slots([slot], grace_s)
        del self._slots[name]
        for key in [k for k, s in self._addresses.items() if s is slot]:
            del self._addresses[key]

    # --- lifecycle --------------------------------------------------------

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the registered transports (once)."""
        if self._started:
            return
        self._started = True
        for transport in list(self._transports.values()):
            await transport.start(self)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Graceful shutdown bounded by ``grace_s``: workers drain, then transports stop.

        Safe to call twice: a second (or concurrent) caller returns once the first
        caller's drain has finished.
        """
        await self._stopping_once.run(lambda: self._stop(grace_s))

    async def _stop(self, grace_s: float) -> None:
        self._stopping = True
        deadline = time.monotonic() + grace_s
        await self._stop_slots(list(self._slots.values()), grace_s)
        for transport in list(self._transports.values()):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                await asyncio.wait_for(transport.stop(), remaining)
            except TimeoutError:
                log.error("node %s: transport %s did not stop in time", self.name, transport)
        self._stopped = True

    async def _stop_slots(self, slots: list[_Slot], grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        for slot in slots:
            slot.worker.stopping()
        run_tasks = [s.tasks[1] for s in slots if len(s.tasks) > 1]
        if run_tasks:
            await asyncio.wait(run_tasks, timeout=max(0.1, deadline - time.monotonic()))
        # Let the mailboxes drain (all loops still run, so workers can still talk).
        joins = [asyncio.ensure_future(s.queue.join()) for s in slots]
        if joins:
            _, pending = await asyncio.wait(joins, timeout=max(0.1, deadline - time.monotonic()))
            for join in pending:
                join.cancel()
            await asyncio.gather(*joins, return_exceptions=True)
        tasks = [t for s in slots for t in s.tasks]
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for slot, result in zip([s for s in slots for _ in s.tasks], results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("node %s: worker %s failed: %r", self.name, slot.name, result)
        for slot in slots:
            while not slot.queue.empty():
                _, done = slot.queue.get_nowait()
                if done is not None and not done.done():
                    done.set_exception(UnroutableMessage(f"worker {slot.name} stopped"))
            await slot.worker.teardown()

    # --- routing ----------------------------------------------------------

    async def deliver(self, message: TransportMessage, *, strict: bool = False) -> None:
        """Route one message (from a worker or a transport). Never raises for a bad route.

        A transport that could not send it (its retries ran out at the message's
        deadline) is counted (``transport_errors``); with ``strict`` (a worker sending:
        :class:`Context`'s ``send``, ``reply``, ``forward``) its :class:`SluiceError`
        is raised to the sender, who reports it (a handler that fails so makes its
        stream entry retried, then dead-lettered); without, it is logged here.
        """
        pending = self._route_now(message, None, strict)
        if pending is not None:
            await pending

    async def call_inline(
        self,
        route: Route,
        origin: Route,
        request: object,
        encode: Callable[[Any], bytes],
    ) -> object | None:
        """Ask the local worker at ``route``'s one address to answer ``request`` in this
        task (:meth:`Worker.serve_inline`); its answer, or None when there is no such
        worker or it cannot answer so now (then route the request: :meth:`deliver`).

        The same delivery as a routed message but for the hops: the address resolves
        as in routing, the call is counted (``inline``) and the trace shows the request
        and the answer as routed messages (``encode`` makes their payloads, only when
        the node keeps a trace).
        """
        if len(route) != 1 or route[0].type != AddressType.LOCAL:
            return None
        first = route[0]
        slot = self._addresses.get(first.value)
        if slot is None:
            return None
        reply = await slot.worker.serve_inline(first, request, origin)
        if reply is None:
            return None
        self.counters["inline"] += 1
        if self.trace.maxlen:
            self.trace.append((first, TransportMessage(route, origin, encode(request))))
            self.trace.append((origin[0], TransportMessage(origin, route, encode(reply))))
        return reply

    async def deliver_tracked(self, message: TransportMessage) -> asyncio.Future[None]:
        """Route, and return a future that completes when the message was handled."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._route(message, done)
        return done

    def _drop(self, exc: RoutingError | PayloadTooLarge, counter: str, done: _Done) -> None:
        self.counters[counter] += 1
        self.counters["dropped"] += 1
        log.error("node %s: dropped message: %s", self.name, exc)
        if done is not None and not done.done():
            done.set_exception(exc)

    def route_tracked(
        self, message: TransportMessage
    ) -> tuple[asyncio.Future[None], Coroutine[Any, Any, None] | None]:
        """Route without a coroutine when it can: returns the completion future and,
        when the mailbox is full or a transport must send, a coroutine the caller
        MUST await (for hot loops delivering many messages)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        return done, self._route_now(message, done)

    async def _route(self, message: TransportMessage, done: _Done) -> None:
        pending = self._route_now(message, done)
        if pending is not None:
            await pending

    def _route_now(
        self, message: TransportMessage, done: _Done, strict: bool = False
    ) -> Coroutine[Any, Any, None] | None:
        """Route synchronously if possible; else return what is left to await."""
        onward = message.onward_route
        if not onward:
            self._drop(UnroutableMessage("empty onward route"), "unroutable", done)
            return None
        if len(message.payload) > self.max_payload:
            exc = PayloadTooLarge(
                f"payload of {len(message.payload)} bytes to {onward[0]} exceeds {self.max_payload}"
            )
            self._drop(exc, "oversized", done)
            return None
        first = onward[0]
        if first.type == AddressType.LOCAL:
            slot = self._addresses.get(first.value)
            if slot is None:
                self._drop(UnroutableMessage(f"no worker at {first}"), "unknown_worker", done)
                return None
            if self.trace.maxlen:
                self.trace.append((first, message))
            if slot.worker.intercept(message):
                self.counters["intercepted"] += 1
                if done is not None:
                    done.set_result(None)
                return None
            queue = slot.queue
            size = len(message.payload)
            if queue.full() or (
                slot.bytes + size > slot.worker.mailbox_bytes and not queue.empty()
            ):
                return self._put_when_room(slot, message, done)  # back-pressure
            slot.bytes += size
            queue.put_nowait((message, done))
            return None
        transport = self._transports.get(first.type)
        if transport is None:
            self._drop(
                UnknownAddressType(f"no transport for address type {first.type} ({first})"),
                "unknown_address_type",
                done,
            )
            return None
        return self._send(transport, message, done, strict)

    async def _put_when_room(self, slot: _Slot, message: TransportMessage, done: _Done) -> None:
        size = len(message.payload)
        while slot.bytes + size > slot.worker.mailbox_bytes and not slot.queue.empty():
            slot.room.clear()
            await slot.room.wait()
        slot.bytes += size
        await slot.queue.put((message, done))

    async def _send(
        self, transport: Transport, message: TransportMessage, done: _Done, strict: bool = False
    ) -> None:
        try:
            await transport.send(message)
        except SluiceError as exc:
            self.counters["transport_errors"] += 1
            if strict and done is None:
                raise  # the sender reports it (logged once, there)
            log.error(
                "node %s: transport %d failed to send: %s", self.name, transport.address_type, exc
            )
            if done is not None and not done.done():
                done.set_exception(exc)
            return
        self.counters["sent"] += 1
        if done is not None and not done.done():
            done.set_result(None)

    # --- worker loops -----------------------------------------------------

    async def _run_loop(self, slot: _Slot, wctx: WorkerContext) -> None:
        try:
            await slot.worker.run(wctx)
        except Exception:  # surfaced now (logged, counted) and again when the node stops
            self.counters["worker_run_failures"] += 1
            log.exception("node %s: worker %s stopped running", self.name, slot.name)
            raise

    async def _mailbox_loop(self, slot: _Slot) -> None:
        worker, queue = slot.worker, slot.queue
        limit = max(1, worker.batch_size)
        while True:
            items = [await queue.get()]
            while len(items) < limit and not queue.empty():
                items.append(queue.get_nowait())
            slot.bytes -= sum(len(message.payload) for message, _ in items)
            slot.room.set()
            contexts = []
            for message, _ in items:
                address = message.onward_route[0]
                contexts.append(Context(self, address, message))
            try:
                if limit == 1:
                    await worker.handle(contexts[0])
                else:
                    await worker.handle_batch(contexts)
            except asyncio.CancelledError:
                for _, done in items:
                    if done is not None and not done.done():
                        done.cancel()
                raise
            except SluiceError as exc:  # e.g. its reply could not be sent: no traceback
                self.counters["handler_errors"] += 1
                log.error("node %s: worker %s failed on a message: %s", self.name, slot.name, exc)
                for _, done in items:
                    if done is not None and not done.done():
                        done.set_exception(exc)
            except Exception as exc:  # a handler bug must not stop the node: log, count, report
                self.counters["handler_errors"] += 1
                log.exception("node %s: worker %s failed on a message", self.name, slot.name)
                for _, done in items:
                    if done is not None and not done.done():
                        done.set_exception(exc)
            else:
                self.counters["handled"] += len(items)
                for _, done in items:
                    if done is not None and not done.done():
                        done.set_result(None)
            finally:
                for _ in items:
                    queue.task_done()

    def statistics(self) -> dict[str, int]:
        stats = dict(self.counters)
        for name, slot in self._slots.items():
            stats[f"mailbox:{name}"] = slot.queue.qsize()
        return stats


__all__ = ["Context", "Node", "Transport", "Worker", "WorkerContext"]
