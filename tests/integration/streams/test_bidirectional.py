"""Seed 000: bi-directional streams using workers, with the seed's example routes."""

from __future__ import annotations

import asyncio

from pipeline.routing.message import Address, Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker
from pipeline.streams.bidirectional import ReturnRegistry, bidirectional_consumer

from .conftest import MakeNode, Recorder, eventually


class Destination(Worker):
    def __init__(self) -> None:
        self.got: list[TransportMessage] = []

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.message)
        await ctx.reply(b"pong:" + ctx.payload)


def traced(node: Node, address: str) -> list[TransportMessage]:
    """Application messages routed to ``address`` (not the stream service's replies)."""
    return [
        m
        for a, m in node.trace
        if a == Address.local(address) and not str(m.return_route[0]).startswith("stream_service")
    ]


async def test_seed_000_example_routes(make_node: MakeNode) -> None:
    # SERVER: consumer for "SERVER_STREAM"; publishers for return streams come from its registry.
    server, _ = await make_node("server")
    server_registry = ReturnRegistry(
        server, "SERVER_STREAM", name_for=lambda _: "bds_publisher_local_address_on_sender"
    )
    server_consumer = bidirectional_consumer(
        server, server_registry, client_id="server", holder="server"
    )
    await server.add_worker("consumer:SERVER", server_consumer)
    destination = Destination()
    await server.add_worker("remote_destination", destination)
    await asyncio.wait_for(server_consumer.ready.wait(), 5)

    # CLIENT: consumer for "CLIENT_STREAM", publisher for "SERVER_STREAM" returning to "CLIENT_STREAM".
    client, _ = await make_node("client")
    client_registry = ReturnRegistry(client, "CLIENT_STREAM")
    client_consumer = bidirectional_consumer(
        client, client_registry, client_id="client", holder="client"
    )
    await client.add_worker("consumer:CLIENT", client_consumer)
    await client_registry.ensure("SERVER_STREAM", name="bds_publisher_local_address_on_remote")
    sender = Recorder()
    await client.add_worker("sender", sender)

    # The seed's message: onward [publisher on the sender, remote_destination], return [sender].
    request = TransportMessage(
        Route(["bds_publisher_local_address_on_remote", "remote_destination"]),
        Route(["sender"]),
        b"ping",
    )
    await client.deliver(request)
    await eventually(lambda: len(sender.got) == 1)

    assert traced(client, "bds_publisher_local_address_on_remote") == [request]
    # Delivered on the server with the return stream's publisher prepended.
    assert destination.got == [
        TransportMessage(
            Route(["remote_destination"]),
            Route(["bds_publisher_local_address_on_sender", "sender"]),
            b"ping",
        )
    ]
    # The seed's response: onward [publisher on the server, sender], return [remote_destination].
    assert traced(server, "bds_publisher_local_address_on_sender") == [
        TransportMessage(
            Route(["bds_publisher_local_address_on_sender", "sender"]),
            Route(["remote_destination"]),
            b"pong:ping",
        )
    ]
    # And back at the sender, the route traces the way to reply again.
    assert sender.got == [
        TransportMessage(
            Route(["sender"]),
            Route(["bds_publisher_local_address_on_remote", "remote_destination"]),
            b"pong:ping",
        )
    ]
    # The client's registry reused the publisher it already had for SERVER_STREAM.
    assert client_registry.names == {"SERVER_STREAM": "bds_publisher_local_address_on_remote"}
    assert server_registry.names == {"CLIENT_STREAM": "bds_publisher_local_address_on_sender"}


async def test_many_round_trips(make_node: MakeNode) -> None:
    server, _ = await make_node("server")
    registry = ReturnRegistry(server, "S")
    consumer = bidirectional_consumer(server, registry, client_id="server", holder="server")
    await server.add_worker("consumer:S", consumer)
    await server.add_worker("dest", Destination())
    client, _ = await make_node("client")
    client_registry = ReturnRegistry(client, "C")
    await client.add_worker(
        "consumer:C",
        bidirectional_consumer(client, client_registry, client_id="client", holder="client"),
    )
    publisher = await client_registry.ensure("S")
    sender = Recorder()
    await client.add_worker("sender", sender)
    for i in range(100):
        await client.deliver(
            TransportMessage(Route([publisher, "dest"]), Route(["sender"]), str(i).encode())
        )
    await eventually(lambda: len(sender.got) == 100)
    assert sorted(m.payload for m in sender.got) == sorted(
        b"pong:" + str(i).encode() for i in range(100)
    )
