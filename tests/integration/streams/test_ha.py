"""Streams on Redis beyond one server: Sentinel and Cluster, and a master killed under them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pipeline import keys, redisconn
from pipeline.errors import SluiceError
from pipeline.redisconn import Role
from pipeline.routing.node import Context
from pipeline.streams.client import Publisher
from tests.support.poll import until

from .conftest import MakeNode
from .test_client import Sink, items, publish, start_consumer
from .test_transport import to_b, two_nodes

LAYOUTS = ["sentinel", "cluster"]


@pytest.fixture(params=LAYOUTS)
def ha(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """(URL, fixture object) of an empty Sentinel group or Cluster, whole."""
    group = request.getfixturevalue(
        {"sentinel": "redis_sentinels", "cluster": "redis_cluster"}[request.param]
    )
    group.wait_whole()
    group.flush()
    return str(group.url), group


async def test_two_nodes_through_streams(make_node: MakeNode, ha: tuple[str, Any]) -> None:
    url, _ = ha
    node_a, _, _, a = await two_nodes(make_node, url=url)  # type: ignore[arg-type]
    for i in range(200):
        await node_a.deliver(to_b(str(i).encode()))
    await until(lambda: len(a.got) == 200, within_s=30)
    assert sorted(m.payload for m in a.got) == sorted(b"re:" + str(i).encode() for i in range(200))
    client = redisconn.connect_sync(url, Role.CLI)
    try:  # the registry is written beside the stream, not in its script
        assert client.sismember(keys.streams_registry(), "stream_b")
    finally:
        client.close()


async def test_publish_and_consume(make_node: MakeNode, ha: tuple[str, Any]) -> None:
    url, _ = ha
    node, _ = await make_node("A", url=url)
    await node.add_worker("pub", Publisher("s"))
    sink = Sink()
    consumer = await start_consumer(node, sink)
    await publish(node, items(0, 50))
    await until(lambda: len(sink.got) == 50, within_s=30)
    assert sink.got == items(0, 50)
    await until(lambda: consumer.saved != "", within_s=30)


class Recording(Publisher):
    """A publisher that records which payloads were confirmed and which failed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.confirmed: list[bytes] = []
        self.failed: list[bytes] = []

    async def handle_batch(self, batch: list[Context]) -> None:
        data = [ctx.payload for ctx in batch]
        try:
            await super().handle_batch(batch)
        except SluiceError:
            self.failed.extend(data)  # counted once per payload; the process goes on
        else:
            self.confirmed.extend(data)


@pytest.mark.timeout(240)
async def test_master_killed_under_a_publisher_and_a_consumer(
    make_node: MakeNode, ha: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """kill -9 of the stream's master while one node pushes and consumes: the node goes on,
    everything pushed after the failover arrives, and the counts are reported."""
    url, group = ha
    node, _ = await make_node("A", url=url)
    pub = Recording("f")
    await node.add_worker("pub", pub)
    sink = Sink()
    await start_consumer(node, sink, stream="f")
    before, after = items(0, 300), items(300, 400)

    async def drive(batch: list[bytes]) -> None:
        for item in batch:
            await publish(node, [item])
            await asyncio.sleep(0.005)

    driving = asyncio.create_task(drive(before))
    await until(lambda: len(sink.got) >= 100, within_s=30)
    killed_at = time.monotonic()
    layout = "cluster" if hasattr(group, "master_of") else "sentinel"
    dead = group.kill_master(keys.stream("f")) if layout == "cluster" else group.kill_master()
    try:
        await driving
        await until(
            lambda: len(pub.confirmed) + len(pub.failed) == len(before),
            "every push before the failover settled",
            within_s=60,
        )
        await asyncio.to_thread(group.wait_failed_over, dead)
        # The node recovers: every later push is confirmed and consumed.
        await drive(after)
        await until(
            lambda: set(after) <= set(sink.got), "pushes after the failover consumed", within_s=60
        )
        recovered_s = time.monotonic() - killed_at
        assert set(after) <= set(pub.confirmed)
        got = set(sink.got)
        lost = [x for x in pub.confirmed if x not in got]
        duplicated = len(sink.got) - len(got)
        with capsys.disabled():
            print(  # noqa: T201 - the counts are the test's report
                f"\nstreams failover ({layout}): "
                f"confirmed={len(pub.confirmed)} failed={len(pub.failed)} lost={len(lost)} "
                f"duplicated={duplicated} recovered_in={recovered_s:.1f}s"
            )
    finally:
        await asyncio.to_thread(group.heal)


def test_cluster_slots_differ_for_the_registry_and_a_stream() -> None:
    """Why the create script and the registry update are two steps on a cluster."""
    from redis.crc import key_slot

    assert key_slot(keys.stream("s").encode()) != key_slot(keys.streams_registry().encode())
    assert key_slot(keys.stream("s").encode()) == key_slot(keys.push_dedup("s", "r").encode())
