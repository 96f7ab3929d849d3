"""One slow, blocking read kept fresh in a worker thread: stale-while-refresh, never two at once."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

#: Errors are cut to this length (they go to the page, not a log).
ERROR_CHARS = 300

T = TypeVar("T")


def one_line(exc: BaseException) -> str:
    """An error for the page: its first line only (deltalake appends a Rust backtrace), bounded."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:ERROR_CHARS]


class Source(Generic[T]):
    """A blocking read refreshed in a worker thread: stale-while-refresh, never two at once.

    ``value`` is the last good read (None before the first), ``error`` the
    last failure's text (None after a good read). A slow source is read less
    often: at most a tenth of the time goes to reading it.
    """

    def __init__(
        self,
        name: str,
        read: Callable[[], T],
        ttl_s: float,
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self.name = name
        self._fn = read
        self._ttl_s = ttl_s
        self._errors = errors
        self.value: T | None = None
        self.error: str | None = None
        self.reads = 0
        self._at = -math.inf
        self._took_s = 0.0
        self._task: asyncio.Future[None] | None = None

    @property
    def age_s(self) -> float | None:
        """Seconds since the last read ended, to a tenth; None before a good read."""
        return None if self.value is None else round(time.monotonic() - self._at, 1)

    async def fresh(self, first_wait_s: float) -> None:
        """Start a read when the last one is stale; wait for it only when there is nothing yet."""
        stale = time.monotonic() - self._at >= max(self._ttl_s, 10 * self._took_s)
        if stale and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._read())
        if self._task is not None and self.value is None and self.error is None:
            await asyncio.wait({self._task}, timeout=first_wait_s)

    async def _read(self) -> None:
        started = time.monotonic()
        try:
            self.value = await asyncio.to_thread(self._fn)
            self.error = None
        except self._errors as exc:
            log.warning("sluice coverage: %s: %r", self.name, exc)
            self.error = f"{self.name}: {one_line(exc)}"
        except Exception as exc:
            # The reporting boundary: a bug in a read is logged with its traceback
            # and shown as one line, and the other sources are still served.
            log.exception("sluice coverage: %s failed", self.name)
            self.error = f"{self.name}: internal error {type(exc).__name__}"[:ERROR_CHARS]
        finally:
            self.reads += 1
            self._at = time.monotonic()
            self._took_s = self._at - started

    async def close(self) -> None:
        """Wait for a read under way (its failure is already reported in ``error``)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


__all__ = ["ERROR_CHARS", "Source", "one_line"]
