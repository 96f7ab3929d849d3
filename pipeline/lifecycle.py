"""Shutdown that runs once and never skips a step.

:class:`Once`: ``close()`` / ``stop()`` safe to call twice, and concurrently.
The first caller runs the shutdown; every later or concurrent caller waits
until that run has finished (a second ``stop()`` never returns while the
first is still draining).

:func:`run_every`: the steps of one cleanup, each run even when an earlier one
failed, the failures raised together at the end (as aiohttp's
``CleanupContext`` does); :func:`cancel_and_wait` ends a background task and
hands back its failure, if it had one. No Redis: only asyncio.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

__all__ = ["Once", "cancel_and_wait", "run_every"]


class Once:
    """Runs one async shutdown at most once; every caller returns after it ended.

    If the first run raises, or is cancelled, the others still return (the
    shutdown is over, whatever its outcome); only the first caller sees the error.
    """

    __slots__ = ("_done", "_started")

    def __init__(self) -> None:
        self._started = False
        self._done = asyncio.Event()

    @property
    def started(self) -> bool:
        """True once a shutdown began (it may still be running)."""
        return self._started

    @property
    def done(self) -> bool:
        """True once the shutdown has ended."""
        return self._done.is_set()

    async def run(self, shutdown: Callable[[], Awaitable[None]]) -> None:
        """Run ``shutdown()`` if no caller did yet, else wait for that run to end."""
        if self._started:
            await self._done.wait()
            return
        self._started = True
        try:
            await shutdown()
        finally:
            self._done.set()


async def run_every(steps: Iterable[Callable[[], Awaitable[object]]]) -> None:
    """Await every step in order, even when one fails; then raise what failed.

    One failure is raised as itself, several as an :class:`ExceptionGroup` of
    them all, in step order. A ``CancelledError`` out of a step is that step's
    normal end (it awaited a task it had cancelled) unless the task running the
    cleanup is itself being cancelled: then the remaining steps still run and
    the cancellation is raised last, after every failure was logged by its step
    or raised here.
    """
    errors: list[Exception] = []
    cancelled = False
    for step in steps:
        try:
            await step()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                cancelled = True
        except Exception as exc:  # noqa: BLE001 - collected, raised at the end: the next steps still run
            errors.append(exc)
    if cancelled:
        if errors:
            raise ExceptionGroup("cleanup steps failed while cancelled", errors)
        raise asyncio.CancelledError
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup("cleanup steps failed", errors)


async def cancel_and_wait(task: asyncio.Task[object] | None) -> None:
    """Cancel ``task`` and wait for its end; raise its failure if it failed before.

    A task that ended by the cancel returns quietly; one that had already
    failed raises its exception here, so a cleanup built with :func:`run_every`
    reports it and still runs its other steps.
    """
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
