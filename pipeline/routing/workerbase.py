"""What a local worker is: the :class:`Worker` base and the contexts its hooks get.

A worker lives at one or more local addresses of a node (see
:mod:`pipeline.routing.node`). Its handler gets a :class:`Context` (the
message, the address it came to, and the sends that trace routes); its
lifecycle hooks get a :class:`WorkerContext` (its node and main address).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pipeline.routing.message import Address, Route, TransportMessage

if TYPE_CHECKING:
    from pipeline.routing.node import Node

__all__ = ["DEFAULT_MAILBOX", "DEFAULT_MAILBOX_BYTES", "Context", "Worker", "WorkerContext"]

DEFAULT_MAILBOX = 1024
#: Payload bytes a mailbox holds before senders wait (besides its message count).
DEFAULT_MAILBOX_BYTES = 64 << 20


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
        """Called once after the mailbox drained (save state, release leases).

        When the node stops, every worker's teardown runs even if another's
        raised (the failures are raised together once the node has stopped).
        """
