"""Ending tasks that drop their first cancellation, as Python 3.11's ``asyncio.wait_for``
makes a task inside redis-py do (see pipeline/bus/tasks.py)."""

from __future__ import annotations

import asyncio
import contextlib

from pipeline.bus.tasks import end


async def _drops_one_cancel(ended: list[str]) -> None:
    """Drops its first cancellation, then works on (a loop that awaits no Redis call)."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    try:
        await asyncio.Event().wait()  # works on, until cancelled again
    finally:
        ended.append("ended")


async def test_a_task_that_dropped_its_cancellation_is_cancelled_again() -> None:
    ended: list[str] = []
    task = asyncio.create_task(_drops_one_cancel(ended))
    plain = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    assert await end([task, plain], grace_s=2.0, recancel_s=0.05) == set()
    assert task.cancelled() and plain.cancelled() and ended == ["ended"]


async def test_a_task_that_never_ends_is_handed_back_after_the_grace() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert await end([task], grace_s=0.2, recancel_s=0.05) == {task}
    assert task.cancelling() >= 2  # cancelled again after it dropped the first
    release.set()
    task.cancel()
    await asyncio.wait([task])
    assert task.done()


async def test_finished_and_failed_tasks_are_left_as_they_are() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    failed = asyncio.create_task(fails())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    assert await end([failed, done], grace_s=1.0) == set()
    assert isinstance(failed.exception(), ValueError) and done.result() is None
