"""Bi-directional streams using workers (seed 000).

A node consumes its own stream and publishes to other nodes' streams. An
entry is msgpack ``[return_stream, message]``, the message in its wire form
``[1, onward, return, payload]`` (embedded, so one unpack decodes the entry):

* :class:`BiPublisher` (a local worker) pops itself from the onward route and
  publishes the message with the return stream in its state;
* the bi-directional consumer decodes an entry, ensures a local publisher for
  its return stream exists (:class:`ReturnRegistry`), prepends that
  publisher's address to the return route and routes the message on the
  local node.

So with publishers named as in the seed, a message sent as
``onward [bds_publisher_local_address_on_remote, remote_destination],
return [sender]`` reaches ``remote_destination`` with return route
``[bds_publisher_local_address_on_sender, sender]``, and its reply travels
``onward [bds_publisher_local_address_on_sender, sender], return
[remote_destination]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgpack

from pipeline.errors import LocalProtocolError, RemoteProtocolError, SluiceError
from pipeline.routing.message import Address, TransportMessage, unpack_bounded
from pipeline.routing.node import Context, Node
from pipeline.streams.consumer import Consumer
from pipeline.streams.publisher import Publisher


def encode_entry(return_stream: str, message: TransportMessage) -> bytes:
    """msgpack ``[return_stream, [1, onward, return, payload]]`` (one pack, one unpack)."""
    data: bytes = msgpack.packb([return_stream, message.to_obj()], use_bin_type=True)
    return data


def decode_entry(data: bytes, *, max_payload: int) -> tuple[str, TransportMessage]:
    """Raises RemoteProtocolError for anything that is not ``[str, message]``."""
    obj = unpack_bounded(data, max_payload=max_payload, what="stream entry")
    if not (isinstance(obj, list) and len(obj) == 2):
        raise RemoteProtocolError("malformed stream entry: not [return_stream, message]")
    ret, message = obj
    if not isinstance(ret, str) or not ret:
        raise RemoteProtocolError("malformed stream entry: bad return stream")
    return ret, TransportMessage.from_obj(message, max_payload=max_payload)


class BiPublisher(Publisher):
    """Publishes routed messages to ``stream``, tagged with ``return_stream``."""

    def __init__(self, stream: str, return_stream: str, *, service: str = "stream_service") -> None:
        super().__init__(stream, service=service)
        self.return_stream = return_stream

    def encode(self, ctx: Context) -> bytes:
        m = ctx.message
        return encode_entry(
            self.return_stream, TransportMessage(m.onward_route.rest(), m.return_route, m.payload)
        )


class ReturnRegistry:
    """Maps a return stream to the local publisher that writes to it (one per stream)."""

    def __init__(
        self,
        node: Node,
        own_stream: str,
        *,
        name_for: Callable[[str], str] = lambda stream: f"bds_publisher:{stream}",
        max_publishers: int = 1000,
        service: str = "stream_service",
    ) -> None:
        self.node = node
        self.own_stream = own_stream
        self.name_for = name_for
        self.max_publishers = max_publishers
        self.service = service
        self.names: dict[str, str] = {}
        self._addresses: dict[str, Address] = {}
        self._lock = asyncio.Lock()

    def get(self, stream: str) -> Address | None:
        """The publisher's address if it exists already."""
        return self._addresses.get(stream)

    async def ensure(self, stream: str, name: str | None = None) -> Address:
        """The address of the publisher to ``stream``, created on first use."""
        address = self._addresses.get(stream)
        if address is not None:
            return address
        async with self._lock:
            found = self.names.get(stream)
            if found is None:
                if len(self.names) >= self.max_publishers:
                    raise LocalProtocolError(
                        f"more than {self.max_publishers} return streams on node {self.node.name}"
                    )
                found = name or self.name_for(stream)
                publisher = BiPublisher(stream, self.own_stream, service=self.service)
                await self.node.add_worker(found, publisher)
                self.names[stream] = found
                self._addresses[stream] = Address.local(found)
        return self._addresses[stream]


def bidirectional_consumer(
    node: Node,
    registry: ReturnRegistry,
    *,
    client_id: str,
    holder: str,
    max_failures: int = 3,
    lease_ttl_ms: int = 15_000,
    service: str = "stream_service",
    batch: int = 1000,
) -> Consumer:
    """A consumer of ``registry.own_stream`` that routes entries on ``node`` (seed 000)."""

    async def handle_batch(entries: list[tuple[str, bytes]]) -> list[Any]:
        outcomes: list[Any] = []
        for _, data in entries:
            try:
                ret, message = decode_entry(data, max_payload=node.max_payload)
                publisher = registry.get(ret) or await registry.ensure(ret)
                traced = TransportMessage(
                    message.onward_route, message.return_route.prepend(publisher), message.payload
                )
            except SluiceError as exc:  # malformed entry, too many hops or return streams
                outcomes.append(exc)
                continue
            done, pending = node.route_tracked(traced)
            if pending is not None:
                await pending
            outcomes.append(done)
        return outcomes

    return Consumer(
        registry.own_stream,
        batch_handler=handle_batch,
        client_id=client_id,
        holder=holder,
        max_failures=max_failures,
        lease_ttl_ms=lease_ttl_ms,
        service=service,
        batch=batch,
    )
