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
awaited, mailboxes drain, handler tasks end, queued messages fail, workers'
teardowns run, then transports stop. Every step runs even when one fails;
the failures are raised together at the end. Safe to call twice.

Where the pieces live: the worker API (:class:`Worker`, :class:`Context`,
:class:`WorkerContext`) in :mod:`pipeline.routing.workerbase`, a worker's mailbox
and loops in :mod:`pipeline.routing.slots`, the stop steps in
:mod:`pipeline.routing.shutdown`; this module routes and owns them.
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
from pipeline.routing.shutdown import slot_steps, transport_step
from pipeline.routing.slots import Done, Slot, put_when_room, run_mailbox, run_worker

# Context is re-exported: its home is pipeline.routing.workerbase, and it stays importable here.
from pipeline.routing.workerbase import Context, Worker, WorkerContext

log = logging.getLogger(__name__)

MAX_WORKERS = 10_000


class Transport(Protocol):
    """Carries messages whose first hop has type ``address_type`` to other nodes."""

    address_type: int

    async def start(self, node: Node) -> None: ...

    async def send(self, message: TransportMessage) -> None: ...

    async def stop(self) -> None: ...


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
        self._slots: dict[str, Slot] = {}
        self._addresses: dict[bytes, Slot] = {}
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
        slot = Slot(name, worker)
        wctx = WorkerContext(self, name)
        await worker.setup(wctx)
        self._slots[name] = slot
        self._addresses[slot.address.value] = slot
        for alias in aliases:
            self.add_alias(name, alias)
        slot.tasks.append(asyncio.create_task(run_mailbox(self, slot), name=f"{name}:mailbox"))
        slot.tasks.append(asyncio.create_task(run_worker(self, slot, wctx), name=f"{name}:run"))
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
        """Stop worker ``name`` (drain, teardown) and free its addresses.

        Its addresses are freed even when a step of its stop failed; the
        failures are raised once every step ran.
        """
        slot = self._slots.get(name)
        if slot is None:
            return
        deadline = time.monotonic() + grace_s

        async def forget() -> None:
            self._slots.pop(name, None)
            for key in [k for k, s in self._addresses.items() if s is slot]:
                del self._addresses[key]

        await lifecycle.run_every([*slot_steps(self.name, [slot], deadline), forget])

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

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` has run every step, whether or not one failed."""
        return self._stopped

    async def stop(self, grace_s: float = 10.0) -> None:
        """Graceful shutdown bounded by ``grace_s``: workers drain, then transports stop.

        Every step runs even when one fails: each worker's teardown, the failing
        of messages still queued, each transport's stop, and the node then
        reports :attr:`stopped`. Each failure is logged once; they are raised
        together at the end (one as itself, several as an ``ExceptionGroup``).

        Safe to call twice: a second (or concurrent) caller returns once the first
        caller's drain has finished (only the first sees the failures).
        """
        await self._stopping_once.run(lambda: self._stop(grace_s))

    async def _stop(self, grace_s: float) -> None:
        self._stopping = True
        deadline = time.monotonic() + grace_s

        async def mark_stopped() -> None:
            self._stopped = True

        await lifecycle.run_every(
            [
                *slot_steps(self.name, list(self._slots.values()), deadline),
                *(transport_step(self.name, t, deadline) for t in self._transports.values()),
                mark_stopped,
            ]
        )

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

    def _drop(self, exc: RoutingError | PayloadTooLarge, counter: str, done: Done) -> None:
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

    async def _route(self, message: TransportMessage, done: Done) -> None:
        pending = self._route_now(message, done)
        if pending is not None:
            await pending

    def _route_now(
        self, message: TransportMessage, done: Done, strict: bool = False
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
            return self._to_mailbox(first, message, done)
        transport = self._transports.get(first.type)
        if transport is None:
            self._drop(
                UnknownAddressType(f"no transport for address type {first.type} ({first})"),
                "unknown_address_type",
                done,
            )
            return None
        return self._send(transport, message, done, strict)

    def _to_mailbox(
        self, first: Address, message: TransportMessage, done: Done
    ) -> Coroutine[Any, Any, None] | None:
        """Hand ``message`` to the local worker at ``first``: intercepted, queued, or
        (mailbox full) a coroutine that queues it when there is room."""
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
        if slot.is_full_for(len(message.payload)):
            return put_when_room(slot, message, done)  # back-pressure
        slot.put_nowait(message, done)
        return None

    async def _send(
        self, transport: Transport, message: TransportMessage, done: Done, strict: bool = False
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

    def statistics(self) -> dict[str, int]:
        stats = dict(self.counters)
        for name, slot in self._slots.items():
            stats[f"mailbox:{name}"] = slot.queue.qsize()
        return stats


__all__ = ["Context", "Node", "Transport", "Worker", "WorkerContext"]
