"""A node's stop runs every exit even when one fails, and raises the failures at the end."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pipeline.errors import UnroutableMessage
from pipeline.routing.message import Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker


class Tracked(Worker):
    """Records its teardown; ``fail`` makes the teardown raise after recording it."""

    def __init__(self, name: str, torn: list[str], *, fail: bool = False) -> None:
        self.name = name
        self.torn = torn
        self.fail = fail

    async def handle(self, ctx: Context) -> None:
        pass

    async def teardown(self) -> None:
        self.torn.append(self.name)
        if self.fail:
            raise RuntimeError(f"teardown of {self.name} broke")


class Stuck(Tracked):
    """Never finishes a message: what it has queued at stop is never handled."""

    mailbox_size = 10

    async def handle(self, ctx: Context) -> None:
        await asyncio.Event().wait()


class Unwilling(Tracked):
    """Raises when asked to stop."""

    def stopping(self) -> None:
        raise RuntimeError(f"{self.name} refused to stop")


class Recorded:
    """A transport that records its stop; ``fail`` makes the stop raise after recording it."""

    def __init__(self, address_type: int, stopped: list[int], *, fail: bool = False) -> None:
        self.address_type = address_type
        self.stopped = stopped
        self.fail = fail

    async def start(self, node: Node) -> None:
        pass

    async def send(self, message: TransportMessage) -> None:
        pass

    async def stop(self) -> None:
        self.stopped.append(self.address_type)
        if self.fail:
            raise OSError(f"transport {self.address_type} broke")


async def three_workers(node: Node, torn: list[str], *, first_fails: bool = True) -> None:
    await node.add_worker("a", Tracked("a", torn, fail=first_fails))
    await node.add_worker("b", Tracked("b", torn))
    await node.add_worker("c", Tracked("c", torn))


async def test_a_failing_teardown_and_transport_stop_skip_no_other_exit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torn: list[str] = []
    stopped: list[int] = []
    node = Node("n")
    node.register_transport(Recorded(1, stopped, fail=True))
    node.register_transport(Recorded(2, stopped))
    await node.start()
    await three_workers(node, torn)

    with pytest.raises(ExceptionGroup) as caught:
        await node.stop(grace_s=5)

    assert torn == ["a", "b", "c"]
    assert stopped == [1, 2]
    assert node.stopped
    assert [str(e) for e in caught.value.exceptions] == [
        "teardown of a broke",
        "transport 1 broke",
    ]
    # each failure logged once, with its cause
    teardown_logs = [r for r in caplog.records if "failed its teardown" in r.getMessage()]
    transport_logs = [r for r in caplog.records if "failed to stop" in r.getMessage()]
    assert len(teardown_logs) == 1 and len(transport_logs) == 1
    assert teardown_logs[0].exc_info and transport_logs[0].exc_info
    assert str(teardown_logs[0].exc_info[1]) == "teardown of a broke"
    # a second stop returns (the stop is over, whatever its outcome)
    await asyncio.wait_for(node.stop(), 5)


async def test_one_failure_is_raised_as_itself_after_every_exit() -> None:
    torn: list[str] = []
    stopped: list[int] = []
    node = Node("n")
    node.register_transport(Recorded(1, stopped))
    await node.start()
    await three_workers(node, torn)

    with pytest.raises(RuntimeError, match="teardown of a broke"):
        await node.stop(grace_s=5)

    assert torn == ["a", "b", "c"]
    assert stopped == [1]
    assert node.stopped
    await asyncio.wait_for(node.stop(), 5)


async def test_a_clean_stop_raises_nothing_and_reports_stopped() -> None:
    torn: list[str] = []
    node = Node("n")
    await three_workers(node, torn, first_fails=False)
    assert not node.stopped
    await node.stop(grace_s=5)
    assert torn == ["a", "b", "c"]
    assert node.stopped


async def test_queued_messages_fail_even_after_another_teardown_failed() -> None:
    torn: list[str] = []
    node = Node("n")
    await node.add_worker("a", Tracked("a", torn, fail=True))
    await node.add_worker("stuck", Stuck("stuck", torn))
    in_hand = await node.deliver_tracked(TransportMessage(Route(["stuck"]), Route(), b"0"))
    queued = [
        await node.deliver_tracked(TransportMessage(Route(["stuck"]), Route(), bytes([i])))
        for i in range(1, 4)
    ]

    with pytest.raises(RuntimeError, match="teardown of a broke"):
        await node.stop(grace_s=0.1)

    assert torn == ["a", "stuck"]
    assert in_hand.cancelled()
    for done in queued:
        assert isinstance(done.exception(), UnroutableMessage)
    assert node.stopped


async def test_a_worker_that_refuses_to_stop_does_not_keep_the_others_up() -> None:
    torn: list[str] = []
    stopped: list[int] = []
    node = Node("n")
    node.register_transport(Recorded(1, stopped))
    await node.start()
    await node.add_worker("a", Unwilling("a", torn))
    await node.add_worker("b", Tracked("b", torn))

    with pytest.raises(RuntimeError, match="a refused to stop"):
        await node.stop(grace_s=5)

    assert torn == ["a", "b"]
    assert stopped == [1]
    assert node.stopped


async def test_remove_worker_frees_its_addresses_even_when_its_teardown_fails() -> None:
    torn: list[str] = []
    node = Node("n")
    await node.add_worker("a", Tracked("a", torn, fail=True), aliases=["a2"])
    with pytest.raises(RuntimeError, match="teardown of a broke"):
        await node.remove_worker("a")
    assert torn == ["a"]
    assert not node.has_address("a") and not node.has_address("a2")
    assert node.worker("a") is None
    await node.stop()


class SlowTeardown(Tracked):
    def __init__(self, name: str, torn: list[str]) -> None:
        super().__init__(name, torn)
        self.tearing_down = asyncio.Event()

    async def teardown(self) -> None:
        self.tearing_down.set()
        await asyncio.Event().wait()


async def test_a_stop_cancelled_midway_still_runs_the_remaining_exits() -> None:
    torn: list[str] = []
    stopped: list[int] = []
    node = Node("n")
    node.register_transport(Recorded(1, stopped))
    await node.start()
    slow = SlowTeardown("slow", torn)
    await node.add_worker("slow", slow)
    await node.add_worker("b", Tracked("b", torn))

    stopping = asyncio.create_task(node.stop(grace_s=5))
    await asyncio.wait_for(slow.tearing_down.wait(), 5)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping

    assert torn == ["b"]
    assert stopped == [1]
    assert node.stopped
    await asyncio.wait_for(node.stop(), 5)


async def test_the_failures_reach_the_caller_of_async_with(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    torn: list[str] = []
    with pytest.raises(RuntimeError, match="teardown of a broke"):
        async with Node("n") as node:
            await three_workers(node, torn)
    assert torn == ["a", "b", "c"]
    assert node.stopped
