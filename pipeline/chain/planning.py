"""Resumption planning, pure: what to send, in which order, and where to start.

No I/O here (no asyncio, Redis, aiohttp or pyarrow; an import-contract test
keeps it so): :mod:`pipeline.chain.history.resumption` runs these against Redis
(:mod:`pipeline.chain.history.tail`) and the lake (:mod:`pipeline.chain.history.lakepages`).

- :class:`Sender`: dedup, reorg depth and fork choice over what one
  subscriber was sent; every emitted block goes through one.
- :class:`TailIndex`: the Redis tail's metadata, the heaviest chain and
  every hash seen; :func:`index_entry` adds one stream entry to it.
- :class:`Plan`: where a subscription starts and why (:class:`Reason`).
- The ports resumption is wired to: :class:`BlockSink` (where blocks go),
  :class:`History` (lake reads) and :class:`TailReads` (Redis tail reads).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.blockcodec import (
    ENTRY_FIELD,
    MAX_BLOCK_NUM,
    Block,
    check_raw,
    decode_block,
    decode_raw,
    effective_weight,
    raw_weight,
)
from pipeline.chain.burst import SharedFrames
from pipeline.errors import BadBatch

if TYPE_CHECKING:  # annotations only: this module never loads pyarrow
    import pyarrow as pa

log = logging.getLogger(__name__)

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


class Sender:
    """Dedup, reorg detection and fork choice over what was sent in the last ``window`` heights.

    :meth:`accept` takes blocks of a canonical source (the lake, the tail's
    chain) in height order: a block at or below the head with another hash
    replaces everything from its height up. :meth:`take` takes blocks in
    production order (replay, live) and follows the heaviest chain: a block
    that is not heavier than the head is held as a side block (the last
    :data:`RETAIN` heights), and a heavier block on another branch is sent
    with the held blocks that link it to the sent chain, the first of them
    marked as a reorg above the common ancestor (a shorter, heavier chain too).
    """

    __slots__ = ("_blocks", "_hashes", "_lost", "_window", "floor", "head", "head_weight", "sent")

    #: Heights below the head whose blocks are kept to rebuild a branch (at most
    #: 2 * RETAIN blocks per subscriber: deeper branches fall back to production order).
    RETAIN = 128

    def __init__(self, start: int, window: int = 4096) -> None:
        self.floor = start
        self.head = start - 1
        self.head_weight = -1
        self.sent = 0
        self._hashes: dict[int, str] = {}
        self._window = window
        #: hash -> block, sent or held, in the last RETAIN heights
        self._blocks: dict[str, Emit] = {}
        #: the hashes of blocks on branches the lake says lost (:meth:`lose`), oldest first
        self._lost: dict[str, None] = {}

    def accept(
        self, num: int, hash: str, weight: int | None = None, emit: Emit | None = None
    ) -> int | None:
        """None to skip the block, else the reorg depth (0: it extends the head)."""
        if num > self.head:
            self.head = num
            self._note(num, hash, weight, emit)
            return 0
        if self.sent == 0 and num < self.floor:
            return None  # below the resume point, before anything was sent
        if self._hashes.get(num) == hash:
            return None
        depth = self.head - num + 1
        for height in range(num, self.head + 1):
            self._hashes.pop(height, None)
        self.head = num
        self._note(num, hash, weight, emit)
        return depth

    def extend(self, emits: list[Emit]) -> None:
        """Note a run of consecutive blocks above the head, in one step.

        The same as :meth:`accept` for each (each would return 0), at a fraction
        of the cost per block: a lake page in catch-up
        (``catchup_blocks_per_s`` of ``make bench B=resume``). Only the last
        ``2 * RETAIN`` blocks of the run are kept for rebuilding branches.
        """
        first, last = emits[0], emits[-1]
        if first.num <= self.head or last.num - first.num + 1 != len(emits):
            raise ValueError("extend takes consecutive blocks above the head")
        hashes = self._hashes
        for emit in emits:
            hashes[emit.num] = emit.hash
        if first.num > 0 and first.num - 1 not in hashes:
            hashes[first.num - 1] = first.parent  # the parent of the first block is on the chain
        for stale in range(max(first.num - self._window, 0), last.num - self._window + 1):
            hashes.pop(stale, None)
        self.sent += len(emits)
        self.head = last.num
        self.head_weight = last.weight
        for emit in emits[-2 * self.RETAIN :]:
            self._keep(emit)

    def take(self, emit: Emit) -> list[Emit]:
        """Fork choice for one block in production order: the blocks to send now (maybe none)."""
        num, hash = emit.num, emit.hash
        if (
            num == self.head + 1
            and self.sent
            and not emit.reorg
            and emit.weight > self.head_weight
            and self._hashes.get(num - 1) == emit.parent
            and hash not in self._blocks
        ):
            # The common live case, a heavier child of the head: what the general path
            # below decides for it, in a few lookups (once per subscriber and block,
            # fanout_cpu_us_per_message of make bench B=resume). _note and _keep spelt
            # out: the parent is on the chain already, the window drops one height.
            self.head = num
            self.sent += 1
            hashes = self._hashes
            hashes[num] = hash
            self.head_weight = emit.weight
            hashes.pop(num - self._window, None)
            blocks = self._blocks
            blocks[hash] = emit
            if len(blocks) > 2 * self.RETAIN:
                self._keep(emit)  # (already kept: this only trims)
            return [emit]
        return self._choose(emit)

    def advance(self, emits: list[Emit], run: Run | None = None) -> None:
        """What :meth:`take` does for each of ``emits`` in turn, each known to take its fast
        path: a heavier child of the head, not held, with nothing to announce (a live group
        checked that for all its members at once, :mod:`pipeline.chain.history.live`). The state
        after it equals the state after those takes, at a fraction of their cost: two dict
        updates (``run``: those of ``emits``, built once for every subscriber taking them)
        and a trim where a take would have trimmed."""
        if not emits:
            return
        if run is None:
            run = Run.of(emits)
        hashes, window = self._hashes, self._window
        hashes.update(run.hashes)
        # take pops num - window after noting num: the same keys (none of the run's own
        # can come back after it: num - window is below every later num)
        for stale in range(emits[0].num - window, emits[-1].num - window + 1):
            hashes.pop(stale, None)
        blocks, limit = self._blocks, 2 * self.RETAIN
        i, count = 0, len(emits)
        while i < count:
            room = limit - len(blocks)  # (never negative: every path trims above it)
            if room <= 0:  # the take that would trim: as it would, from its height
                emit = emits[i]
                blocks[emit.hash] = emit
                self.head = emit.num
                self._keep(emit)
                i += 1
            elif i == 0 and room >= count:
                blocks.update(run.blocks)
                i = count
            else:
                blocks.update({e.hash: e for e in emits[i : i + room]})
                i += room
        last = emits[-1]
        self.head = last.num
        self.head_weight = last.weight
        self.sent += count

    def live_state(self) -> tuple[int, str, int] | None:
        """``(head, head hash, head weight)``: what decides whether a block takes
        :meth:`take`'s fast path, besides the hashes held (:meth:`held`); None before
        anything was sent (every block then takes the general path)."""
        at = self._hashes.get(self.head)
        return None if not self.sent or at is None else (self.head, at, self.head_weight)

    def held(self) -> Iterable[str]:
        """The hashes of the blocks kept (sent or held): a block with one of them never
        takes :meth:`take`'s fast path."""
        return self._blocks.keys()

    def _choose(self, emit: Emit) -> list[Emit]:
        """:meth:`take`'s general path: every case, the fast one included."""
        num, hash = emit.num, emit.hash
        if emit.parent in self._lost:
            self.lose(hash)  # a child of a lost block lost too, however heavy
            return []
        if self.sent == 0 or self._hashes.get(num) == hash:
            return [emit] if self.accept(num, hash, emit.weight, emit) == 0 else []
        if hash in self._blocks:
            return []  # held already (or sent, then reorged away: only a heavier block brings it back)
        linked = self._hashes.get(num - 1) == emit.parent or emit.parent in self._blocks
        if linked and emit.weight <= self.head_weight:
            self._keep(emit)  # not heavier than the head (a tie goes to the first seen): held
            return []
        if not linked:
            if num <= self.head + 1 and emit.weight <= self.head_weight:
                return []  # an unlinked block, not heavier: nothing to follow
            # A gap above the head, or a heavier block whose parent was never seen
            # here: replace from its height, as a canonical source would.
            depth = self.accept(num, hash, emit.weight, emit)
            return [] if depth is None else [_with_reorg(emit, depth)]
        branch = [emit]
        while self._hashes.get(branch[-1].num - 1) != branch[-1].parent:
            held = self._blocks.get(branch[-1].parent)
            if held is None or held.num != branch[-1].num - 1:
                break
            branch.append(held)
        branch.reverse()
        ancestor = branch[0].num - 1
        depth = max(0, self.head - ancestor)
        for height in range(ancestor + 1, self.head + 1):
            self._hashes.pop(height, None)
        self.head = ancestor
        out = []
        for i, block in enumerate(branch):
            self.head = block.num
            self._note(block.num, block.hash, block.weight, block)
            out.append(_with_reorg(block, depth if i == 0 else 0))
        return out

    def hold(self, emit: Emit) -> None:
        """Keep a block of a side branch without sending it: a heavier child may bring it."""
        if emit.hash not in self._blocks and self._hashes.get(emit.num) != emit.hash:
            self._keep(emit)

    def lose(self, hash: str) -> None:
        """The lake says the block ``hash`` is on a branch that lost: neither it nor any
        block descending from it is sent from now on (each is lost in turn, :meth:`take`).

        Resumption meets such a block when Redis was trimmed past its parent: the
        parent is in the lake only, as not canonical. Its children still come from
        Redis in production order, heavier than the head while that branch led; sent,
        they would follow a branch whose first block the subscriber never got.
        The last ``2 * RETAIN`` are remembered (a lost branch's children come soon after it).
        """
        lost = self._lost
        lost[hash] = None
        if len(lost) > 2 * self.RETAIN:
            del lost[next(iter(lost))]

    def knows(self, num: int, hash: str) -> bool:
        """Whether the block ``hash`` at ``num`` was sent, is held or is lost: a child of
        it links, or is lost with it (no history to read for it either way)."""
        return self._hashes.get(num) == hash or hash in self._blocks or hash in self._lost

    def _keep(self, emit: Emit) -> None:
        self._blocks[emit.hash] = emit
        if len(self._blocks) > 2 * self.RETAIN:
            low = self.head - self.RETAIN
            for h in [h for h, e in self._blocks.items() if e.num < low]:
                del self._blocks[h]
            while len(self._blocks) > 2 * self.RETAIN:  # many side blocks up high: oldest first
                del self._blocks[next(iter(self._blocks))]

    def _note(self, num: int, hash: str, weight: int | None, emit: Emit | None) -> None:
        self.sent += 1
        self._hashes[num] = hash
        self.head_weight = num + 1 if weight is None else weight
        if emit is not None:
            self._keep(emit)
            if num > 0 and num - 1 not in self._hashes:
                self._hashes[num - 1] = emit.parent  # the parent of the first block is on the chain
        stale = num - self._window
        if stale in self._hashes:
            del self._hashes[stale]

    def hash_at(self, num: int) -> str | None:
        return self._hashes.get(num)


@dataclass(frozen=True, slots=True)
class Run:
    """The dicts :meth:`Sender.advance` adds for a run of consecutive emits (no hash twice)."""

    hashes: dict[int, str]
    blocks: dict[str, Emit]

    @classmethod
    def of(cls, emits: list[Emit]) -> Run:
        return cls({e.num: e.hash for e in emits}, {e.hash: e for e in emits})


def _with_reorg(emit: Emit, depth: int) -> Emit:
    if emit.reorg == depth:
        return emit
    return Emit(emit.num, emit.hash, emit.parent, emit.results, depth, emit.weight)


@dataclass(slots=True)
class TailIndex:
    """The Redis tail, metadata only: the heaviest chain and every hash seen.

    ``chain`` maps heights to (hash, parent, entry id) of the chain ending at
    the heaviest block (fork choice: the greatest effective weight, ties to
    the block seen first); ``seen`` maps every hash to (num, parent, entry id,
    effective weight). A block heavier than the head on another branch moves
    the chain to that branch (walking its parents through ``seen``), also
    when the branch is shorter; a lighter one only joins ``seen``.
    """

    chain: dict[int, tuple[str, str, bytes]] = field(default_factory=dict)
    seen: dict[str, tuple[int, str, bytes, int]] = field(default_factory=dict)
    last_id: bytes = b"0-0"
    hi: int = -1
    head_weight: int = -1

    @property
    def lo(self) -> int | None:
        return min(self.chain) if self.chain else None

    def add(
        self, num: int, hash: str, parent: str, entry_id: bytes, weight: int | None = None
    ) -> None:
        self.last_id = entry_id
        if hash in self.seen:
            return  # published again: the first entry stands
        w = effective_weight(num, weight)
        self.seen[hash] = (num, parent, entry_id, w)
        if self.chain and w <= self.head_weight:
            return  # not heavier than the head: a side block
        branch = [(num, hash, parent, entry_id)]
        chain, seen = self.chain, self.seen
        while chain:
            at = chain.get(branch[-1][0] - 1)
            if at is not None and at[0] == branch[-1][2]:
                break  # linked to the chain
            up = seen.get(branch[-1][2])
            if up is None or up[0] != branch[-1][0] - 1 or len(branch) > len(seen):
                break  # parent unknown here: replace from this height, as production order did
            branch.append((up[0], branch[-1][2], up[1], up[2]))
        start = branch[-1][0]
        for height in range(start, self.hi + 1):
            chain.pop(height, None)
        for n, h, p, e in reversed(branch):
            chain[n] = (h, p, e)
        self.hi = num
        self.head_weight = w


def index_entry(
    tail: TailIndex,
    entry_id: bytes,
    fields: dict[bytes, bytes],
    refused: Callable[[bytes, Exception], None] | None = None,
) -> tuple[int, str] | None:
    """Add one Redis entry's metadata to ``tail``: its (num, hash), or None when invalid.

    The whole entry is checked (size, then shape: :func:`check_raw`), so the
    catch-up encoders never meet a block the live path would refuse. An
    invalid entry only moves ``last_id``, and is handed to ``refused`` (else logged).
    """
    try:
        raw = decode_raw(fields[ENTRY_FIELD])
        check_raw(raw)
        num, hash = raw["num"], raw["hash"].hex()
        if not indexable(num, raw["hash"], raw["parent"]):
            raise BadBatch("block number or hashes out of range")
        parent = raw["parent"].hex()
        below = tail.chain.get(num - 1)
        if below is not None and below[0] == parent:
            parent = below[0]  # one string for the parent and its hash: about 110 bytes an entry
        tail.add(num, hash, parent, entry_id, raw_weight(raw))
    except (BadBatch, KeyError, AttributeError, TypeError) as exc:
        if refused is not None:
            refused(entry_id, exc)
        else:
            log.warning("skipping invalid chain entry %r: %s", entry_id, exc)
        tail.last_id = entry_id
        return None
    return num, hash


def indexable(num: object, hash: object, parent: object) -> bool:
    """Whether an entry's metadata can join the index: a number the lake can hold, 32-byte hashes.

    A number past :data:`MAX_BLOCK_NUM` would otherwise become the head of the
    tail for good (its implied weight beats every real block).
    """
    return (
        type(num) is int
        and 0 <= num <= MAX_BLOCK_NUM
        and isinstance(hash, bytes)
        and isinstance(parent, bytes)
        and len(hash) == len(parent) == 32
    )


def decode_servable(data: bytes) -> Block:
    """:func:`decode_block`, refusing (``BadBatch``) a number past :data:`MAX_BLOCK_NUM`.

    Such a block cannot be archived, and its implied weight would beat every
    real block after it: one such entry would stop live data for everyone.
    """
    block = decode_block(data)
    if block.num > MAX_BLOCK_NUM:
        raise BadBatch(f"block number {block.num} is past {MAX_BLOCK_NUM}")
    return block


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


@dataclass(slots=True)
class Plan:
    """Where a subscription starts, why, and the snapshot of the tail it will stream."""

    start: int
    tail: TailIndex
    history: History | None
    reason: Reason
    #: the lake pages already opened at ``start`` while checking the hash, and the first one
    prefetched: tuple[Iterator[pa.Table], list[Emit]] | None = None


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
    "Run",
    "Sender",
    "TailIndex",
    "TailReads",
    "decode_servable",
    "index_entry",
    "indexable",
    "rewind_start",
]
