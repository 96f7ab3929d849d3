"""One lake reader shared by every subscription of a server, refreshed cheaply.

Opening a :class:`~pipeline.lake.storage.reader.LakeReader` loads the Delta log, and
a fresh reader starts with an empty file cache. :class:`SharedHistory` opens
one reader per server and hands it to every resumption; it moves the reader
to the latest table version at most every ``check_every_s`` seconds (an
incremental log update, a directory listing when nothing changed). Resumption
forces a refresh itself whenever the lake looks shorter than Redis says it
must be, so a reader a little behind never causes a gap.

Calls may come from several threads (``asyncio.to_thread``): a lock guards
opening and refreshing. :meth:`SharedHistory.drop_idle` drops the reader's
cached files that went unused (``SLUICE_SERVE_CACHE_IDLE_S``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pipeline.chain.planning import History
from pipeline.errors import SluiceError


class SharedHistory:
    """A history factory (``TieredResumption(history_factory=...)``) returning one shared reader."""

    def __init__(
        self,
        open_reader: Callable[[], Any],
        *,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if check_every_s < 0:
            raise ValueError("check_every_s must be non-negative")
        self._open = open_reader
        self._every = check_every_s
        self._clock = clock
        self._reader: Any = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self._probed: tuple[float, str | None] | None = None
        self.opened = 0
        self.refreshes = 0

    def __call__(self) -> History | None:
        with self._lock:
            now = self._clock()
            if self._reader is None:
                self._reader = self._open()
                self.opened += 1
                self._checked = now
            elif now - self._checked >= self._every:
                self._refresh_locked(now)
            reader: History | None = self._reader
            return reader

    def fresh(self) -> History | None:
        """The shared reader if it is open and was checked less than ``check_every_s`` ago,
        else None (then call the factory, in a thread: it may read the store).

        No I/O and no wait, so the event loop may call it: a subscribe then needs no
        thread hop to find the reader (``subscribe_cpu_ms`` of ``make bench B=resume``).
        """
        if not self._lock.acquire(blocking=False):
            return None
        try:
            reader: History | None = self._reader
            if reader is None or self._clock() - self._checked >= self._every:
                return None
            return reader
        finally:
            self._lock.release()

    def refresh(self) -> None:
        """Move the shared reader to the latest version now."""
        with self._lock:
            if self._reader is not None:
                self._refresh_locked(self._clock())

    def probe(self, max_age_s: float = 1.0) -> str | None:
        """Can the lake be read now? None, or one line saying why not (``/healthz``).

        Opens or refreshes the shared reader (a Delta log listing); the answer is
        reused for ``max_age_s`` so health checks cost the store little.
        """
        from pipeline.lake.storage.store import store_errors

        errors: tuple[type[BaseException], ...] = (SluiceError, *store_errors())
        with self._lock:
            now = self._clock()
            if self._probed is not None and now - self._probed[0] < max_age_s:
                return self._probed[1]
            error: str | None = None
            try:
                if self._reader is None:
                    self._reader = self._open()
                    self.opened += 1
                else:
                    self._refresh_locked(now)
                self._checked = now
            except errors as exc:
                error = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
            self._probed = (now, error)
            return error

    def drop_idle(self, idle_s: float) -> int:
        """Drop the reader's cached files not used for ``idle_s`` seconds (an idle server
        returns to its baseline; a busy one keeps its cache); how many were dropped."""
        with self._lock:
            reader = self._reader
        drop = getattr(reader, "drop_idle_cache", None)
        return int(drop(idle_s)) if drop is not None else 0

    def _refresh_locked(self, now: float) -> None:
        refresh = getattr(self._reader, "refresh", None)
        if refresh is not None:
            refresh()
            self.refreshes += 1
        self._checked = now
