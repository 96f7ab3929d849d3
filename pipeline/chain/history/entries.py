"""Chain-stream entries the server refused: counted once, logged once.

Every entry ``sluice serve`` reads from the Redis chain stream (the live
tailer, the tail index, replay after a catch-up) is decoded through
:mod:`pipeline.blockcodec`, which checks its length before decoding and
bounds every map and list by its msgpack header (:data:`~pipeline.blockcodec.MAX_ENTRY_BYTES`,
:data:`~pipeline.blockcodec.MAX_ITEMS`; the unpacker's own stack bounds the
depth), then its shape. A refused entry is skipped; the blocks around it are
served as usual. The same entry is met by several readers (the tailer, the
index, each replaying subscriber): :class:`Refusals` counts and logs it once.
Each of them also asks :meth:`Refusals.admit` whether a decoded block's height
is its parent's plus one (:class:`~pipeline.chain.heights.Heights`, one per
server): a block that lies about its height is refused the same way by all.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections import OrderedDict

from pipeline.chain.heights import Heights
from pipeline.chain.metrics import Metrics
from pipeline.errors import BadBatch
from pipeline.redisio.conn import parse_entry_id

log = logging.getLogger(__name__)

#: Refused entry ids remembered (so each is counted and logged once); older ones are forgotten.
REMEMBER = 4096


class Refusals:
    """Count (``sluice_serve_entries_refused_total``) and log each refused entry once.

    The refused ids are also remembered in order, so that reads of the stream
    can leave them out (:meth:`within`): a 20 MB entry refused once is not
    read again by every subscriber that catches up past it.
    """

    def __init__(self, metrics: Metrics | None = None, *, remember: int = REMEMBER) -> None:
        self._metrics = metrics
        self._remember = remember
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        #: the ids of ``_seen`` as (ms, seq), sorted
        self._sorted: list[tuple[tuple[int, int], bytes]] = []
        self.count = 0
        #: the heights of recent blocks, shared by every reader of the stream
        self.heights = Heights()

    def admit(self, entry_id: bytes, num: int, hash: str, parent: str) -> bool:
        """Whether a decoded block may be served: refused (counted, logged once) when its
        height is not its parent's plus one, or when it descends from such a block."""
        why = self.heights.check(num, hash, parent)
        if why is None:
            return True
        if entry_id not in self._seen and self._metrics is not None:
            self._metrics.inc("sluice_serve_bad_heights_total")
        self(entry_id, BadBatch(why))
        return False

    def within(self, after: bytes, upto: bytes | None = None) -> list[bytes]:
        """Refused ids in ``(after, upto]`` (``upto`` None: no upper bound), oldest first."""
        if not self._sorted:
            return []
        lo = bisect.bisect_right(self._sorted, (parse_entry_id(after), b"\xff"))
        hi = (
            len(self._sorted)
            if upto is None
            else bisect.bisect_right(self._sorted, (parse_entry_id(upto), b"\xff"))
        )
        return [entry_id for _key, entry_id in self._sorted[lo:hi]]

    def __call__(self, entry_id: bytes, exc: Exception) -> None:
        if entry_id in self._seen:
            return
        self._seen[entry_id] = None
        # not a stream id (a test's): counted and logged, not skipped in reads
        with contextlib.suppress(ValueError):
            bisect.insort(self._sorted, (parse_entry_id(entry_id), entry_id))
        if len(self._seen) > self._remember:
            old, _ = self._seen.popitem(last=False)
            with contextlib.suppress(ValueError):
                self._sorted.remove((parse_entry_id(old), old))
        self.count += 1
        if self._metrics is not None:
            self._metrics.inc("sluice_serve_entries_refused_total")
        log.warning("refused chain entry %s (skipped): %s", entry_id.decode(errors="replace"), exc)


__all__ = ["REMEMBER", "Refusals"]
