"""The stream client's hot-path deadlines keep ``asyncio.timeout``'s contract."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.errors import LocalProtocolError
from pipeline.streams.deadlines import Deadlines
from tests.support.poll import until


async def test_expiry_surfaces_as_timeout_error_and_leaves_no_cancellation() -> None:
    deadlines = Deadlines()
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(TimeoutError), deadlines.guard(0.01):
        await asyncio.Event().wait()  # (how soon it fires is the benchmark's business)
    assert task.cancelling() == 0
    assert not deadlines.calls
    await asyncio.sleep(0)  # no cancellation left pending for the next await


async def test_finishing_in_time_leaves_nothing_to_fire() -> None:
    deadlines = Deadlines()
    with deadlines.guard(0.05) as task:
        await asyncio.sleep(0)
    assert task is asyncio.current_task()
    assert not deadlines.calls
    # past the deadline: the timer's check ran (and then stopped, nothing being guarded)
    await until(lambda: deadlines._timer is None, "the timer's check", within_s=60)
    assert task.cancelling() == 0


async def test_another_cancellation_passes_through() -> None:
    deadlines = Deadlines()
    started = asyncio.Event()

    async def guarded() -> None:
        with deadlines.guard(10):
            started.set()
            await asyncio.Event().wait()

    job = asyncio.create_task(guarded())
    await started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert not deadlines.calls


async def test_each_call_owns_its_expiry() -> None:
    deadlines = Deadlines()
    with deadlines.guard(10):
        with pytest.raises(TimeoutError), deadlines.guard(0.01):
            await asyncio.Event().wait()
        await asyncio.sleep(0)  # the outer one is still fine
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0

    async def slow() -> None:
        with deadlines.guard(0.01):
            await asyncio.sleep(5)

    async def quick() -> None:
        with deadlines.guard(10):
            await asyncio.sleep(Deadlines.TICK_S * 2)

    results = await asyncio.gather(slow(), quick(), return_exceptions=True)
    assert isinstance(results[0], TimeoutError) and results[1] is None


def test_outside_a_task_it_is_refused() -> None:
    with pytest.raises((LocalProtocolError, RuntimeError)):
        Deadlines().guard(1)
