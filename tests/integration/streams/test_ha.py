"""Streams on Redis beyond one server: Sentinel and Cluster, and a master killed under them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pipeline import keys
from pipeline.errors import SluiceError
from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role
from pipeline.redisio.durability import Durability
from pipeline.routing.message import Route
from pipeline.routing.node import Context
from pipeline.streams import protocol as p
from pipeline.streams.publisher import Publisher
from pipeline.streams.service import StreamService
from pipeline.streams.serviceredis import connect
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
    return group.ready_url(), group


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

    def __init__(self, stream: str, **kwargs: Any) -> None:
        super().__init__(stream, **kwargs)
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
@pytest.mark.parametrize(
    "min_replicas",
    [0, 1],
    ids=["async", "wait1"],
)
async def test_master_killed_under_a_publisher_and_a_consumer(
    make_node: MakeNode, ha: tuple[str, Any], min_replicas: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """kill -9 of the stream's master while one node pushes and consumes: the node goes on,
    everything pushed after the failover arrives, and the counts are reported. With
    ``min_replicas=1`` no confirmed push is lost (and writes wait for a replica to return)."""
    url, group = ha
    durability = Durability(min_replicas, 500)
    node, _ = await make_node("A", url=url, durability=durability)
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
        await asyncio.to_thread(group.wait_failed_over, dead)
        if min_replicas:  # the promoted master has no replica until the dead one returns
            await asyncio.to_thread(group.heal)
        # Pushes refused meanwhile are retried (until SLUICE_NODE_SEND_TIMEOUT_S): with
        # min_replicas=1 they wait for the healed replica, so this comes after the heal.
        await until(
            lambda: len(pub.confirmed) + len(pub.failed) == len(before),
            "every push before the failover settled",
            within_s=90,
        )
        # The node recovers: every later push is confirmed and consumed.
        await drive(after)
        # A consumer may read an entry before its push is confirmed (the XADD is visible
        # while its WAIT still runs): wait for every push's outcome, then for the consumer.
        await until(
            lambda: set(after) <= set(pub.confirmed) | set(pub.failed),
            "every push after the failover settled",
            within_s=60,
        )
        await until(
            lambda: set(after) <= set(sink.got), "pushes after the failover consumed", within_s=60
        )
        recovered_s = time.monotonic() - killed_at
        assert set(after) <= set(pub.confirmed)
        got = set(sink.got)
        lost = [x for x in pub.confirmed if x not in got]
        duplicated = len(sink.got) - len(got)
        if min_replicas:
            assert not lost, f"{len(lost)} confirmed pushes lost despite WAIT {min_replicas}"
        with capsys.disabled():
            print(  # noqa: T201 - the counts are the test's report
                f"\nstreams failover ({layout}, min_replicas={min_replicas}): "
                f"confirmed={len(pub.confirmed)} failed={len(pub.failed)} lost={len(lost)} "
                f"duplicated={duplicated} recovered_in={recovered_s:.1f}s"
            )
    finally:
        await asyncio.to_thread(group.heal)


@pytest.mark.timeout(240)
async def test_master_killed_under_two_nodes_at_500_requests(
    make_node: MakeNode, ha: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The nodes guide's two nodes (A's requests to B's echo through stream_b, replies through
    stream_a), master killed (SIGKILL) after 150 replies: both nodes go on and every request
    whose push was accepted gets its reply; the counts are reported."""
    url, group = ha
    layout = "cluster" if hasattr(group, "master_of") else "sentinel"
    node_a, _, _, a = await two_nodes(make_node, url=url)  # type: ignore[arg-type]
    sent: dict[bytes, asyncio.Future[None]] = {}

    async def drive() -> None:
        for i in range(500):
            payload = str(i).encode()
            sent[payload] = await node_a.deliver_tracked(to_b(payload))
            await asyncio.sleep(0.005)

    driving = asyncio.create_task(drive())
    await until(lambda: len(a.got) >= 150, within_s=60)
    killed_at = time.monotonic()
    dead = (
        group.kill_master(keys.stream("stream_b")) if layout == "cluster" else group.kill_master()
    )
    try:
        await driving
        results = await asyncio.gather(*sent.values(), return_exceptions=True)
        accepted = {k for k, r in zip(sent, results, strict=True) if r is None}
        await asyncio.to_thread(group.wait_failed_over, dead)
        await until(
            lambda: accepted <= {m.payload.removeprefix(b"re:") for m in a.got},
            "a reply to every accepted request",
            within_s=90,
        )
        replies = [m.payload.removeprefix(b"re:") for m in a.got]
        with capsys.disabled():
            print(  # noqa: T201 - the counts are the test's report
                f"\ntwo nodes failover ({layout}): requests=500 accepted={len(accepted)} "
                f"failed={500 - len(accepted)} replies={len(set(replies))} "
                f"duplicated={len(replies) - len(set(replies))} "
                f"recovered_in={time.monotonic() - killed_at:.1f}s"
            )
    finally:
        await asyncio.to_thread(group.heal)


async def test_a_push_no_replica_took_is_not_confirmed(make_node: MakeNode) -> None:
    """One server, no replica, WAIT 1: every push is answered 'unavailable' (retried, then
    failed at the publisher's deadline, here 3 s instead of the default 45 s), counted,
    never confirmed."""
    node, _ = await make_node("A", durability=Durability(1, 50))
    pub = Recording("nr", timeout_s=3.0)
    await node.add_worker("pub", pub)
    await publish(node, [b"x"])
    await until(lambda: pub.failed == [b"x"], within_s=60)
    assert pub.confirmed == []
    assert node.counters["stream_service.not_replicated"] >= 2  # retried, not failed at once
    assert node.counters["stream_client.push_retries"] >= 1
    assert node.counters["stream_client.push_failures"] == 1


@pytest.mark.parametrize("min_replicas", [0, 1])
async def test_many_pushes_in_one_pipeline(ha: tuple[str, Any], min_replicas: int) -> None:
    """A batch of pushes to streams on every master goes out in one pipeline (EVALSHA
    sent as a raw command: redis-py's cluster pipelines refuse the method), with one
    WAIT per master when a replica must hold them."""
    url, _ = ha
    redis = connect(url)
    service = StreamService(redis, durability=Durability(min_replicas, 5000))
    try:
        pushes = [
            (Route(), f"s{i}", p.Push(request_id=f"r{i}", data=(b"x%d" % i,))) for i in range(12)
        ]
        replies = await service._push_replies(pushes)
        assert all(isinstance(r, p.PushConfirm) and r.status == 1 for r in replies), replies
        again = await service._push_replies(pushes)  # idempotent by request id
        assert [r.indexes for r in again] == [r.indexes for r in replies]  # type: ignore[union-attr]
    finally:
        await service.teardown()
        await redis.aclose()


def test_cluster_slots_differ_for_the_registry_and_a_stream() -> None:
    """Why the create script and the registry update are two steps on a cluster."""
    from redis.crc import key_slot

    assert key_slot(keys.stream("s").encode()) != key_slot(keys.streams_registry().encode())
    assert key_slot(keys.stream("s").encode()) == key_slot(keys.push_dedup("s", "r").encode())
