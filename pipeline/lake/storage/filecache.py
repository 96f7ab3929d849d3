"""An LRU of per-file Arrow tables, bounded by their total Arrow size (the reader's cache).

Delta data files are immutable, so an entry keyed by a file's path never goes
stale; :class:`FileCache` only bounds the memory and gives an idle server's
back (:meth:`FileCache.drop_idle`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import pyarrow as pa


class FileCache:
    """LRU of sorted per-file tables, bounded by their total arrow size (thread-safe).

    Each entry remembers when it was last used (``time.monotonic``), so that
    :meth:`drop_idle` can give an idle server's memory back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._items: OrderedDict[tuple[str, str], tuple[pa.Table, float]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: tuple[str, str]) -> pa.Table | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items[key] = (hit[0], time.monotonic())
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: tuple[str, str], table: pa.Table) -> None:
        size = table.nbytes
        if size > self.limit:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.size -= old[0].nbytes
            while self._items and self.size + size > self.limit:
                _, (dropped, _) = self._items.popitem(last=False)
                self.size -= dropped.nbytes
            self._items[key] = (table, time.monotonic())
            self.size += size

    def drop_idle(self, idle_s: float) -> int:
        """Drop the entries not used for ``idle_s`` seconds; how many were dropped."""
        limit = time.monotonic() - idle_s
        dropped = 0
        with self._lock:
            # least recently used first: stop at the first one used since
            while self._items:
                key, (table, used) = next(iter(self._items.items()))
                if used > limit:
                    break
                del self._items[key]
                self.size -= table.nbytes
                dropped += 1
        return dropped
