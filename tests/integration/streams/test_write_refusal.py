"""A push Redis keeps refusing (``maxmemory``, ``noeviction``) reaches its sender as an error.

The stream transport retries it until the message's deadline (``send_timeout_s``),
logging the outage once rather than per attempt; then the sender's ``ctx.send``
raises, and the failure is counted. Before, the node dropped it after 8 attempts,
counted only as ``transport_errors``, and the sender never knew.
"""

from __future__ import annotations

import logging

import pytest

from pipeline.errors import StreamError
from pipeline.routing.message import Route, StreamAddress, TransportMessage
from pipeline.routing.node import Context, Worker
from tests.support.poll import until
from tests.support.refusal import refusing

from .conftest import MakeNode


class Sender(Worker):
    """Sends each payload it gets on through stream ``out``; keeps what ``send`` raised."""

    def __init__(self) -> None:
        self.errors: list[StreamError] = []

    async def handle(self, ctx: Context) -> None:
        route = [StreamAddress(onward_stream="out", return_stream="back").to_address(), "echo"]
        try:
            await ctx.send(route, ctx.payload)
        except StreamError as exc:
            self.errors.append(exc)


async def test_a_refused_push_is_reported_to_its_sender_at_its_deadline(
    make_node: MakeNode, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    node, transport = await make_node("A")
    transport.send_timeout_s = 2.0
    sender = Sender()
    await node.add_worker("sender", sender)
    caplog.set_level(logging.WARNING, logger="pipeline.streams.pusher")
    caplog.set_level(logging.WARNING, logger="pipeline.streams.service")
    with refusing(redis_url):
        await node.deliver(TransportMessage(Route(["sender"]), Route([]), b"m"))
        await until(lambda: sender.errors, "the sender hears of the failure", within_s=30)
    assert "failed until its deadline" in str(sender.errors[0])
    assert "maxmemory" in str(sender.errors[0]) or "unavailable" in str(sender.errors[0])
    counters = node.counters
    assert counters["stream_client.push_failures"] == 1
    assert counters["stream_client.push_retries"] > 1
    assert counters["transport_errors"] == 1
    failing = [r for r in caplog.records if "failing" in r.getMessage()]
    assert len(failing) == 1, [r.getMessage() for r in caplog.records]
    # The service answered every attempt "redis unavailable" (counted) but logged one line.
    answered = [r for r in caplog.records if "unavailable from" in r.getMessage()]
    assert len(answered) == 1, [r.getMessage() for r in answered]
    assert counters["stream_service.unavailable"] > 1
