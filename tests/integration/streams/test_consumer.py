"""The consumer's handler retries on a real Redis: after a pause, never at once."""

from __future__ import annotations

import time

import redis as sync_redis

from pipeline import keys
from pipeline.routing.message import Route, TransportMessage
from pipeline.streams.consumer import RETRY_PAUSE_S, Consumer
from pipeline.streams.publisher import Publisher

from .conftest import MakeNode, eventually


class Flaky:
    """A handler that fails each entry's first ``failures`` attempts (a downstream blip),
    then handles it; records when each attempt began."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts: dict[bytes, list[float]] = {}
        self.got: list[bytes] = []

    async def __call__(self, index: str, data: bytes) -> None:
        times = self.attempts.setdefault(data, [])
        times.append(time.monotonic())
        if len(times) <= self.failures:
            raise ConnectionError(f"downstream blip on attempt {len(times)}")
        self.got.append(data)


async def test_a_handler_failing_twice_then_succeeding_is_retried_after_pauses(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A")
    await node.add_worker("pub", Publisher("s"))
    flaky = Flaky(failures=2)
    consumer = Consumer("s", flaky, client_id="c", holder="A", wait_ms=100, max_failures=3)
    await node.add_worker("consumer:s:A", consumer)
    await node.deliver(TransportMessage(Route(["pub"]), Route(), b"m"))
    await eventually(lambda: flaky.got == [b"m"])
    # Handled on its third and last allowed attempt: not dead-lettered.
    times = flaky.attempts[b"m"]
    assert len(times) == 3
    assert node.counters["consumer.handler_failures"] == 2
    assert node.counters["consumer.dead_lettered"] == 0
    assert redis_client.xlen(keys.dead_letter("s")) == 0
    # The retries were spaced: each attempt after the one before it, by a pause (at
    # least half of RETRY_PAUSE_S, jitter's floor; an immediate retry takes microseconds).
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(gap > 0 for gap in gaps), gaps
    assert all(gap >= RETRY_PAUSE_S / 4 for gap in gaps), gaps
