"""``close()`` / ``stop()`` of long-lived objects: safe twice, and a second caller waits."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.lifecycle import Once
from pipeline.routing import Node, Worker


async def test_once_runs_the_shutdown_once_and_the_second_caller_waits() -> None:
    order: list[str] = []
    release = asyncio.Event()
    runs = 0

    async def shutdown() -> None:
        nonlocal runs
        runs += 1
        await release.wait()
        order.append("drained")

    once = Once()

    async def close(name: str) -> None:
        await once.run(shutdown)
        order.append(name)

    first = asyncio.create_task(close("first"))
    await asyncio.sleep(0)  # first is inside shutdown()
    second = asyncio.create_task(close("second"))
    await asyncio.sleep(0)  # second has called run() and waits
    assert once.started and not once.done and order == []
    release.set()
    await asyncio.gather(first, second)
    assert runs == 1
    assert order[0] == "drained" and set(order[1:]) == {"first", "second"}
    await close("third")  # after the end: returns at once, runs nothing
    assert runs == 1


async def test_once_lets_the_others_return_when_the_shutdown_failed() -> None:
    once = Once()

    async def broken() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError):
        await once.run(broken)
    await once.run(broken)  # over, whatever its outcome: no second run, no error
    assert once.done


class _SlowTeardown(Worker):
    def __init__(self) -> None:
        self.tearing_down = asyncio.Event()
        self.release = asyncio.Event()
        self.order: list[str] = []

    async def handle(self, ctx: object) -> None:
        pass

    async def teardown(self) -> None:
        self.tearing_down.set()
        await self.release.wait()
        self.order.append("drained")


async def test_a_second_node_stop_waits_for_the_first_drain() -> None:
    node = Node("n")
    worker = _SlowTeardown()
    await node.add_worker("slow", worker)

    async def stop(name: str) -> None:
        await node.stop(grace_s=60)
        worker.order.append(name)

    first = asyncio.create_task(stop("first"))
    await worker.tearing_down.wait()
    second = asyncio.create_task(stop("second"))
    await asyncio.sleep(0)  # second is in stop() now
    worker.release.set()
    await asyncio.gather(first, second)
    assert worker.order[0] == "drained", worker.order


async def test_node_is_an_async_context_manager() -> None:
    worker = _SlowTeardown()
    worker.release.set()
    async with Node("n") as node:
        await node.add_worker("w", worker)
    assert worker.order == ["drained"]
