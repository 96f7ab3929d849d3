"""Lake blocks encoded once for every catch-up reading them at the same time.

When several subscriptions catch up from the lake at once (many clients
resubscribing after a restart, ``make bench B=abuse``'s 64 catch-ups from
block 0), they read the same blocks and each would decode the msgpack payload
and encode the JSON results again. :class:`SharedResults` keeps each block's
encoded results and weight, keyed by the block's hash and the subscription's
*shape* (:func:`shape_of`: dialect, weight opt-in, key patterns), so the
others only look them up.

Resumption fills it (:func:`~pipeline.chain.history.lakepages.page_emits`) only
while two or more catch-ups read history; the last one still reads what the
others left in it (it is usually the one behind, that gains most), and a lone
catch-up pays nothing for it. Bounded: at most ``max_blocks`` blocks and
``max_chars`` characters of results; reaching either empties it (no
per-entry bookkeeping on the hot path), and it is emptied when no catch-up
reads the lake, so an idle server holds none of it. Hits, misses and clears are counted in
``sluice_serve_catchup_shared_*``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from pipeline.blockcodec import KeyTest
from pipeline.chain.cardinal import Encoding

#: Blocks kept at most (the concurrent catch-ups of a burst read within a few pages).
MAX_BLOCKS = 16_384
#: Characters of encoded results kept at most (about as many bytes).
MAX_CHARS = 32 << 20


class Counter(Protocol):
    def inc(self, name: str, amount: float = 1.0) -> None: ...


def shape_of(keep: KeyTest | None) -> Hashable | None:
    """What decides a block's results besides the block: None when it cannot be told
    (a key filter that is not a compiled pattern list), then nothing is shared."""
    return keep.cache_key if isinstance(keep, Encoding) else Encoding(keep).cache_key


class SharedResults:
    """Encoded results and weight of recently read lake blocks (see the module doc)."""

    def __init__(
        self,
        *,
        max_blocks: int = MAX_BLOCKS,
        max_chars: int = MAX_CHARS,
        metrics: Counter | None = None,
    ) -> None:
        if max_blocks < 1 or max_chars < 1:
            raise ValueError("max_blocks and max_chars must be positive")
        self.max_blocks = max_blocks
        self.max_chars = max_chars
        self._metrics = metrics
        self._blocks: dict[tuple[str, Hashable], tuple[list[str], int]] = {}
        self._chars = 0
        self.hits = 0
        self.misses = 0
        self.clears = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, key: tuple[str, Hashable]) -> tuple[list[str], int] | None:
        """The results and weight kept for ``(hash hex, shape)``, or None."""
        return self._blocks.get(key)

    def put(self, key: tuple[str, Hashable], results: list[str], weight: int) -> None:
        """Keep a block's results (callers never change the list afterwards)."""
        size = sum(map(len, results))
        if len(self._blocks) >= self.max_blocks or self._chars + size > self.max_chars:
            self.clear()
        self._blocks[key] = (results, weight)
        self._chars += size

    def clear(self) -> None:
        if self._blocks:
            self._blocks = {}
            self._chars = 0
            self.clears += 1
            self._count("sluice_serve_catchup_shared_clears_total", 1)

    def count(self, hits: int, misses: int) -> None:
        """Note a page's lookups (counted per page, not per block)."""
        self.hits += hits
        self.misses += misses
        self._count("sluice_serve_catchup_shared_hits_total", hits)
        self._count("sluice_serve_catchup_shared_misses_total", misses)

    def _count(self, name: str, amount: int) -> None:
        if self._metrics is not None and amount:
            self._metrics.inc(name, amount)


__all__ = ["MAX_BLOCKS", "MAX_CHARS", "SharedResults", "shape_of"]
