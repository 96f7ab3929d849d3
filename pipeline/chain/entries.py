"""Chain-stream entries the server refused: counted once, logged once.

Every entry ``sluice serve`` reads from the Redis chain stream (the live
tailer, the tail index, replay after a catch-up) is decoded through
:mod:`pipeline.chain.batch`, which checks its length before decoding and
bounds every map and list by its msgpack header (:data:`~pipeline.chain.batch.MAX_ENTRY_BYTES`,
:data:`~pipeline.chain.batch.MAX_ITEMS`; the unpacker's own stack bounds the
depth), then its shape. A refused entry is skipped; the blocks around it are
served as usual. The same entry is met by several readers (the tailer, the
index, each replaying subscriber): :class:`Refusals` counts and logs it once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from pipeline.chain.metrics import Metrics

log = logging.getLogger(__name__)

#: Refused entry ids remembered (so each is counted and logged once); older ones are forgotten.
REMEMBER = 4096


class Refusals:
    """Count (``sluice_serve_entries_refused_total``) and log each refused entry once."""

    def __init__(self, metrics: Metrics | None = None, *, remember: int = REMEMBER) -> None:
        self._metrics = metrics
        self._remember = remember
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self.count = 0

    def __call__(self, entry_id: bytes, exc: Exception) -> None:
        if entry_id in self._seen:
            return
        self._seen[entry_id] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        self.count += 1
        if self._metrics is not None:
            self._metrics.inc("sluice_serve_entries_refused_total")
        log.warning("refused chain entry %s (skipped): %s", entry_id.decode(errors="replace"), exc)


__all__ = ["REMEMBER", "Refusals"]
