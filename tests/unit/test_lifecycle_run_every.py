"""Cleanup that never skips a step: ``run_every`` and ``cancel_and_wait``."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.lifecycle import cancel_and_wait, run_every


def test_every_step_runs_when_the_first_fails() -> None:
    ran: list[str] = []

    async def fail() -> None:
        ran.append("fail")
        raise RuntimeError("first")

    async def ok() -> None:
        ran.append("ok")

    with pytest.raises(RuntimeError, match="first"):
        asyncio.run(run_every([fail, ok, ok]))
    assert ran == ["fail", "ok", "ok"]


def test_several_failures_are_raised_together_in_order() -> None:
    async def fail(n: int) -> None:
        raise ValueError(str(n))

    with pytest.raises(ExceptionGroup) as caught:
        asyncio.run(run_every([lambda: fail(1), lambda: fail(2)]))
    assert [str(e) for e in caught.value.exceptions] == ["1", "2"]


def test_a_task_that_failed_before_is_reported_and_the_rest_still_runs() -> None:
    closed: list[str] = []

    async def main() -> None:
        async def broken() -> None:
            raise OSError("warm-up failed")

        task = asyncio.create_task(broken())
        await asyncio.sleep(0)
        await asyncio.sleep(0)

        async def close() -> None:
            closed.append("client")

        await run_every([lambda: cancel_and_wait(task), close])

    with pytest.raises(OSError, match="warm-up failed"):
        asyncio.run(main())
    assert closed == ["client"]


def test_a_cancelled_background_task_ends_quietly() -> None:
    async def main() -> None:
        task = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        await run_every([lambda: cancel_and_wait(task), lambda: cancel_and_wait(None)])
        assert task.cancelled()

    asyncio.run(main())


def test_a_cleanup_cancelled_meanwhile_finishes_its_steps_then_raises_the_cancel() -> None:
    ran: list[str] = []

    async def main() -> None:
        started = asyncio.Event()

        async def slow() -> None:
            started.set()
            await asyncio.sleep(60)

        async def last() -> None:
            ran.append("last")

        cleanup = asyncio.create_task(run_every([slow, last]))
        await started.wait()
        cleanup.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cleanup
        assert ran == ["last"]

    asyncio.run(main())
