"""The stream client's hot-path deadline keeps ``asyncio.timeout``'s contract."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.errors import LocalProtocolError
from pipeline.streams.client import _Deadline


async def test_expiry_surfaces_as_timeout_error_and_leaves_no_cancellation() -> None:
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(TimeoutError), _Deadline(0.01):
        await asyncio.Event().wait()
    assert task.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending for the next await


async def test_finishing_in_time_cancels_the_timer() -> None:
    with _Deadline(0.05) as task:
        await asyncio.sleep(0)
    assert task is asyncio.current_task()
    await asyncio.sleep(0.1)  # past the deadline: the timer must not fire any more
    assert task.cancelling() == 0


async def test_another_cancellation_passes_through() -> None:
    started = asyncio.Event()

    async def guarded() -> None:
        with _Deadline(10):
            started.set()
            await asyncio.Event().wait()

    job = asyncio.create_task(guarded())
    await started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job


async def test_nested_deadlines_each_own_their_expiry() -> None:
    with _Deadline(10):
        with pytest.raises(TimeoutError), _Deadline(0.01):
            await asyncio.Event().wait()
        await asyncio.sleep(0)  # the outer one is still fine
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


def test_outside_a_task_it_is_refused() -> None:
    with pytest.raises((LocalProtocolError, RuntimeError)):
        _Deadline(1)
