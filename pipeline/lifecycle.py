"""Shutdown that runs once: ``close()`` / ``stop()`` safe to call twice, and concurrently.

The first caller runs the shutdown; every later or concurrent caller waits
until that run has finished (a second ``stop()`` never returns while the
first is still draining). No asyncio, no Redis: one ``asyncio.Event``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["Once"]


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
