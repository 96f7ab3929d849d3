"""Resumption planning, pure: the plan types and the ports resumption is wired to.

No I/O here (no asyncio, Redis, aiohttp or pyarrow; an import-contract test
keeps it so): :mod:`pipeline.chain.history.resumption` runs plans against Redis
(:mod:`pipeline.chain.history.tail`) and the lake (:mod:`pipeline.chain.history.lakepages`).

- :class:`Emit`: one block ready to send.
- :class:`Plan`: where a subscription starts and why (:class:`Reason`), with the
  snapshot of the tail (a :class:`~pipeline.chain.tailindex.TailIndex`) it streams.
- The ports resumption is wired to: :class:`BlockSink` (where blocks go),
  :class:`History` (lake reads) and :class:`TailReads` (Redis tail reads).

Fork choice over what one subscriber was sent is :mod:`pipeline.chain.forkchoice`;
the Redis tail's index is :mod:`pipeline.chain.tailindex`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.chain.burst import SharedFrames
from pipeline.chain.tailindex import TailIndex

if TYPE_CHECKING:  # annotations only: this module never loads pyarrow
    import pyarrow as pa

#: What redis-py returns for XRANGE on a client without decode_responses.
Entries = list[tuple[bytes, dict[bytes, bytes]]]


@dataclass(slots=True)
class Emit:
    """One block ready to send: its JSON results (batch first), hex hashes, reorg depth."""

    num: int
    hash: str
    parent: str
    results: list[str]
    #: 0 when the block extends the subscriber's head, else how many heights it replaces.
    reorg: int = 0
    #: the effective weight (``num + 1`` for a block without one): what fork choice compares
    weight: int = 0
    #: A live block's notification frames by notification prefix, shared by every
    #: subscriber that gets this very object (see :mod:`pipeline.chain.serve.frames`); None
    #: for an emit of one subscriber's own (catch-up), whose frames are encoded as sent.
    frames: dict[str, SharedFrames] | None = field(default=None, compare=False, repr=False)


class BlockSink(Protocol):
    """Where resumption delivers blocks (a websocket subscription, a Dialogue duplex...)."""

    async def put(self, emits: list[Emit]) -> None:
        """Catch-up: wait for room (the subscriber sets the pace)."""

    def put_nowait(self, emits: list[Emit]) -> None:
        """Live: take them now or raise :class:`SlowConsumer`."""

    def ready(self, num: int, hash: str) -> None:
        """The subscriber reached the live head (``num`` = -1 when there is no block yet)."""


class History(Protocol):
    """What resumption reads from the lake; ``pipeline.lake.storage.reader.LakeReader`` is the adapter.

    Rows are ``BlockRow``-like (``num``, ``hash``, ``parent``, ``payload``);
    pages are Arrow tables with the columns ``num``, ``hash`` and ``parent``
    (hex strings) and ``payload``.
    """

    def canonical_at(self, stream: str, num: int) -> Any: ...

    def head(self, stream: str) -> Any: ...

    def find_hash(self, stream: str, hash: bytes) -> Any: ...

    def iter_canonical_arrow(
        self, stream: str, start: int, stop: int | None = None, batch_rows: int = 8192
    ) -> Iterator[pa.Table]: ...

    def refresh(self) -> None:
        """Move to the latest lake version (resumption calls it when the lake looks short)."""


class TailReads(Protocol):
    """What resumption reads from the Redis stream; ``pipeline.chain.history.tail.RedisTail`` is the adapter."""

    async def between(self, first: bytes, last: bytes) -> Entries:
        """Entries with ids in ``[first, last]``, in order."""

    async def after(self, last_id: bytes, count: int) -> Entries:
        """At most ``count`` entries with ids above ``last_id``, in order."""


class Reason(enum.Enum):
    """Why a plan starts where it does."""

    #: the client's hash is the canonical block at its number: start there
    MATCH = "match"
    #: the hash is canonical, at another height than the client said: start there
    HASH = "hash"
    #: the hash is on a reorged branch: start just above its canonical fork point
    FORK = "fork"
    #: the hash is unknown: start ``reorg_threshold`` below the client's number
    REWIND = "rewind"


@dataclass(frozen=True, slots=True)
class Seam:
    """Blocks just below the Redis tail that are canonical though the lake does not mark
    them so yet (:mod:`pipeline.chain.history.seam`): the lake's flags lag the tail.

    ``rows`` are ``(num, hash hex, parent hex, payload)``, lowest first, from
    :attr:`lo` to the block below the tail's first one, with no gap.
    """

    rows: tuple[tuple[int, str, str, bytes], ...]

    @property
    def lo(self) -> int:
        return self.rows[0][0]

    def hash_at(self, num: int) -> str | None:
        """The seam's hash at ``num``, or None when ``num`` is not in it."""
        i = num - self.lo
        return self.rows[i][1] if 0 <= i < len(self.rows) else None

    def rows_from(self, start: int) -> tuple[tuple[int, str, str, bytes], ...]:
        return self.rows[max(0, start - self.lo) :]


@dataclass(slots=True)
class Plan:
    """Where a subscription starts, why, and the snapshot of the tail it will stream."""

    start: int
    tail: TailIndex
    history: History | None
    reason: Reason
    #: the lake pages already opened at ``start`` while checking the hash, and the first one
    prefetched: tuple[Iterator[pa.Table], list[Emit]] | None = None
    #: the canonical blocks below the tail the lake does not mark yet: sent instead of
    #: the lake's from their lowest height up (None when the lake agrees with the tail)
    seam: Seam | None = None


def rewind_start(num: int, threshold: int) -> int:
    """Where a client at an unknown hash starts: ``threshold`` below ``num``, at least 0."""
    return max(0, num - threshold)


__all__ = [
    "BlockSink",
    "Emit",
    "Entries",
    "History",
    "Plan",
    "Reason",
    "Seam",
    "TailReads",
    "rewind_start",
]
