"""Resumption: serve any subscriber from any block, through reorgs, with no gap and no duplicate.

Theory of operation. ``blocks_from(num, hash, keep, sink)`` (the seed's
``StreamsResumption.BlocksFrom``) first *resolves* where to start, then
*streams* in four phases, each starting exactly where the previous stopped:

1. Resolve. The Redis stream's metadata is kept in one :class:`SharedTail`
   per server, brought up to date before each call by reading only the
   entries added since (and dropping those trimmed): a :class:`TailIndex`
   with the canonical chain of the tail (the heaviest chain: greatest
   weight, ties to the block seen first; a shorter, heavier branch wins) and
   every hash seen. A call never reads the whole tail; the plan keeps a snapshot of the
   part of the chain it will stream. If ``hash`` is the canonical block at ``num`` (tail
   first, then the lake), start at ``num``. Otherwise, if the tail or the lake
   knows ``hash`` as a reorged block, walk its ancestors to the canonical fork
   point and start just above it. Otherwise start at ``num - reorg_threshold``
   clamped at 0. There is no second rewind.
2. History: canonical blocks ``[start, tail.lo)`` from the Delta ``blocks``
   table through the JVM-free :class:`~pipeline.lake.reader.LakeReader`,
   checked to be contiguous.
3. Tail: the tail's canonical chain ``[max(start, tail.lo), tail.hi]``, read
   back from Redis by entry id (an entry trimmed meanwhile is read from the
   lake instead).
4. Replay and live: entries after the scan's last id, in production order,
   page by page until caught up; then the sink is registered with the live
   hub *before* a last replay, and live blocks already replayed are skipped
   (by entry id, and by the :class:`Sender` window of sent hashes).

Every emitted block goes through one :class:`Sender`, which drops a block
whose hash was already sent at that height, holds blocks of production order
(replay, live) that are not heavier than what was sent, and sends a heavier
branch with its held blocks, the first marked as a reorg of the given depth
above the common ancestor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import pyarrow as pa
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.chain.batch import (
    ENTRY_FIELD,
    MAX_BLOCK_NUM,
    Block,
    KeyTest,
    decode_block,
    decode_raw,
    effective_weight,
    raw_weight,
)
from pipeline.chain.cardinal import encode_results
from pipeline.chain.producer import LiveBlock, WebsocketHub
from pipeline.errors import BadBatch, BadParams, ResumptionError, SlowConsumer

log = logging.getLogger(__name__)

#: What redis-py returns for XRANGE on a client without decode_responses.
Entries = list[tuple[bytes, dict[bytes, bytes]]]

PAGE = 1000
#: The largest block number served: the lake stores ``num`` as int64.
#: What a subscriber is told when history has a hole (details go to the log).
HISTORY_GAP = "history gap: blocks missing between the lake and redis, resubscribe later"
#: Rows of the first lake page of a subscription (later pages are ``batch_rows``).
FIRST_PAGE = 32
_LIVE_ATTEMPTS = 5


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


class BlockSink(Protocol):
    """Where resumption delivers blocks (a websocket subscription, a Dialogue duplex...)."""

    async def put(self, emits: list[Emit]) -> None:
        """Catch-up: wait for room (the subscriber sets the pace)."""

    def put_nowait(self, emits: list[Emit]) -> None:
        """Live: take them now or raise :class:`SlowConsumer`."""

    def ready(self, num: int, hash: str) -> None:
        """The subscriber reached the live head (``num`` = -1 when there is no block yet)."""


class Resumption(Protocol):
    async def blocks_from(
        self, num: int, hash: bytes, keep: KeyTest | None, sink: BlockSink
    ) -> None:
        """Deliver blocks from ``num`` (see the module doc) until cancelled or failed."""


class History(Protocol):
    """What resumption needs from the lake (``pipeline.lake.reader.LakeReader``)."""

    def canonical_at(self, stream: str, num: int) -> Any: ...

    def find_hash(self, stream: str, hash: bytes) -> Any: ...

    def iter_canonical_arrow(
        self, stream: str, start: int, stop: int | None = None, batch_rows: int = 8192
    ) -> Iterator[pa.Table]: ...


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

    __slots__ = ("_blocks", "_hashes", "_window", "floor", "head", "head_weight", "sent")

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

    def take(self, emit: Emit) -> list[Emit]:
        """Fork choice for one block in production order: the blocks to send now (maybe none)."""
        num, hash = emit.num, emit.hash
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

    def knows(self, num: int, hash: str) -> bool:
        """Whether the block ``hash`` at ``num`` was sent or is held (so a child of it links)."""
        return self._hashes.get(num) == hash or hash in self._blocks

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


def _index_entry(
    tail: TailIndex, entry_id: bytes, fields: dict[bytes, bytes]
) -> tuple[int, str] | None:
    """Add one Redis entry's metadata to ``tail``: its (num, hash), or None when invalid.

    An invalid entry only moves ``last_id``.
    """
    try:
        raw = decode_raw(fields[ENTRY_FIELD])
        num, hash = raw["num"], raw["hash"].hex()
        if not _indexable(num, raw["hash"], raw["parent"]):
            raise BadBatch("block number or hashes out of range")
        parent = raw["parent"].hex()
        below = tail.chain.get(num - 1)
        if below is not None and below[0] == parent:
            parent = below[0]  # one string for the parent and its hash: about 110 bytes an entry
        tail.add(num, hash, parent, entry_id, raw_weight(raw))
    except (BadBatch, KeyError, AttributeError, TypeError):
        log.warning("skipping invalid chain entry %r", entry_id)
        tail.last_id = entry_id
        return None
    return num, hash


def _indexable(num: object, hash: object, parent: object) -> bool:
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


class SharedTail:
    """One :class:`TailIndex` of a Redis chain stream, shared by every call of a server.

    :meth:`refresh` reads only the entries after the last one indexed (pages
    of :data:`PAGE`), drops entries trimmed from Redis, and starts over when the
    stream was recreated. Readers (:meth:`reading`) see an index that does not
    change under them: a refresh waits for them (at most ``writer_wait_s``,
    else it leaves the index as it is for the next call) and new readers wait
    for a pending refresh. Memory is bounded by ``max_entries`` (oldest
    entries leave the index first; they are then served from the lake).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        key: str,
        *,
        max_entries: int = 1_000_000,
        writer_wait_s: float = 2.0,
    ) -> None:
        self._redis = redis
        self._key = key
        self._max = max_entries
        self._writer_wait_s = writer_wait_s
        self.index = TailIndex()
        #: (entry id, num, hash) in production order, to drop what Redis trimmed.
        self._order: deque[tuple[tuple[int, int], int, str]] = deque()
        self._lock = asyncio.Lock()
        self._arrivals = 0
        self._fresh_as_of = 0
        self._readers = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._gate = asyncio.Event()
        self._gate.set()

    def __len__(self) -> int:
        return len(self._order)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[TailIndex]:
        """The index, unchanged until the block exits."""
        while not self._gate.is_set():
            await self._gate.wait()
        self._readers += 1
        self._idle.clear()
        try:
            yield self.index
        finally:
            self._readers -= 1
            if not self._readers:
                self._idle.set()

    async def refresh(self) -> None:
        """Index what was added since the last refresh (one round trip when nothing was).

        Calls that arrive while a refresh runs share the next one: a refresh
        covers every call that arrived before it started.
        """
        self._arrivals += 1
        me = self._arrivals
        async with self._lock:
            if self._fresh_as_of >= me:
                return
            mark = self._arrivals
            if await self._refresh():
                self._fresh_as_of = mark  # (a skipped refresh leaves the next caller to retry)

    async def _refresh(self) -> bool:
        """Bring the index up to date; False when readers held it too long (nothing applied)."""
        while True:
            last = self.index.last_id
            pipe = self._redis.pipeline(transaction=False)
            pipe.xrange(self._key, min="-", max="+", count=1)
            pipe.xrevrange(self._key, max="+", min="-", count=1)
            pipe.xrange(self._key, min="(" + last.decode(), max="+", count=PAGE)
            first, newest, entries = cast(tuple[Entries, Entries, Entries], await pipe.execute())
            checkpoint()
            if not await self._exclusive():
                return False
            try:
                if not newest or _id_key(newest[0][0]) < _id_key(last):
                    if self._order or last != b"0-0":
                        self._reset()  # emptied or recreated (ids went back): start over
                        if newest:
                            continue
                    return True
                self._drop_before(_id_key(first[0][0]))
                for entry_id, fields in entries:
                    added = _index_entry(self.index, entry_id, fields)
                    num, hash = added if added is not None else (-1, "")
                    self._order.append((_id_key(entry_id), num, hash))
                if len(self._order) > self._max:
                    log.warning(
                        "tail index over %d entries: the oldest are served from the lake", self._max
                    )
                    self._drop_before(self._order[len(self._order) - self._max][0])
            finally:
                self._gate.set()
            if len(entries) < PAGE:
                return True

    async def _exclusive(self) -> bool:
        """Close the gate and wait until no reader holds the index; False (gate open) on timeout."""
        self._gate.clear()
        try:
            async with asyncio.timeout(self._writer_wait_s):
                while self._readers:
                    await self._idle.wait()
        except TimeoutError:
            self._gate.set()
            log.warning("tail index refresh skipped: readers held it for %ss", self._writer_wait_s)
            return False
        except BaseException:
            self._gate.set()  # cancelled while waiting: never leave readers locked out
            raise
        return True

    def _reset(self) -> None:
        self.index = TailIndex()
        self._order.clear()

    def _drop_before(self, first: tuple[int, int]) -> None:
        chain, seen = self.index.chain, self.index.seen
        order = self._order
        while order and order[0][0] < first:
            entry_key, num, hash = order.popleft()
            hit = chain.get(num)
            if hit is not None and _id_key(hit[2]) == entry_key:
                del chain[num]
                seen.pop(hash, None)
            elif hash and (hit is None or hit[0] != hash):
                seen.pop(hash, None)  # a block reorged away (a later entry may repeat a hash)

    def snapshot(self, start: int) -> TailIndex:
        """What a plan streaming from ``start`` needs: the chain from there up (plus ``lo``)."""
        index = self.index
        lo = index.lo
        if lo is None or start <= lo:
            chain = dict(index.chain)
        else:
            chain = {n: index.chain[n] for n in range(start, index.hi + 1) if n in index.chain}
            chain[lo] = index.chain[lo]
        return TailIndex(chain=chain, last_id=index.last_id, hi=index.hi)


async def _xrange(
    client: aioredis.Redis,
    key: str,
    *,
    min: str | bytes,
    max: str | bytes,
    count: int | None = None,
) -> Entries:
    entries = cast(Entries, await client.xrange(key, min=min, max=max, count=count))
    checkpoint()
    return entries


def checkpoint() -> None:
    """Re-raise a cancellation that a library swallowed.

    redis-py 8.1's asyncio client sometimes eats the ``CancelledError`` of a
    command cancelled mid-flight and returns normally; a task that then
    awaits something long would never end. Call this after such awaits.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("cancelled during a redis command")


def _id_key(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


@dataclass(slots=True)
class Plan:
    start: int
    tail: TailIndex
    history: History | None
    #: why this start: "match", "fork", "rewind", "hash" (hash found at another height)
    reason: str
    #: the lake pages already opened at ``start`` while checking the hash, and the first one
    prefetched: tuple[Iterator[pa.Table], list[Emit]] | None = None


class TieredResumption:
    """Delta history, then the Redis tail, then the live hub (see the module doc)."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        stream: str,
        hub: WebsocketHub,
        history_factory: Any = None,
        reorg_threshold: int = 64,
        max_tail: int = 1_000_000,
        batch_rows: int = 8192,
    ) -> None:
        self._redis = redis
        self._stream = stream
        self._key = keys.stream(stream)
        self._hub = hub
        self._history_factory = history_factory
        self._threshold = reorg_threshold
        self._max_tail = max_tail
        self._batch_rows = batch_rows
        self._tail = SharedTail(redis, self._key, max_entries=max_tail)

    # --- resolve --------------------------------------------------------------

    async def scan_tail(self) -> TailIndex:
        """The shared tail index, brought up to date; it may change at the caller's next await."""
        await self._tail.refresh()
        return self._tail.index

    async def warm(self) -> None:
        """Index the Redis tail now (a server calls it at start so no client pays for it)."""
        await self._tail.refresh()

    def _open_history(self) -> History | None:
        if self._history_factory is None:
            return None
        history: History | None = self._history_factory()
        return history

    async def resolve(self, num: int, hash: bytes, keep: KeyTest | None = None) -> Plan:
        """Where to start for a client at (``num``, ``hash``); ``keep`` as for :meth:`stream`.

        Reads the shared tail index (refreshed first), never the whole tail;
        the plan holds a snapshot of the tail's chain from its start up.
        """
        if num < 0:
            raise ResumptionError("block number must be non-negative")
        if num > MAX_BLOCK_NUM:
            raise BadParams(f"block number: at most {hex(MAX_BLOCK_NUM)}")
        await self._tail.refresh()
        async with self._tail.reading() as tail:
            plan = await self._resolve(tail, num, hash, keep)
            plan.tail = self._tail.snapshot(plan.start)
        return plan

    async def _resolve(self, tail: TailIndex, num: int, hash: bytes, keep: KeyTest | None) -> Plan:
        history = await asyncio.to_thread(self._open_history)
        want = hash.hex()
        lo = tail.lo
        if num not in tail.chain and history is not None and (lo is None or num < lo):
            # Check the hash on the first page the stream will send anyway: one lake read, not two.
            pages = self._history_pages(history, num, lo)
            first = await asyncio.to_thread(_next_page, pages, keep)
            if not (first and first[0].num == num) and await _refresh(history):
                # A shared reader may be a little behind the lake: look again at the latest version.
                _close(pages)
                pages = self._history_pages(history, num, lo)
                first = await asyncio.to_thread(_next_page, pages, keep)
            if first and first[0].num == num and first[0].hash == want:
                return Plan(
                    start=num, tail=tail, history=history, reason="match", prefetched=(pages, first)
                )
            _close(pages)
            canonical = first[0].hash if first and first[0].num == num else None
        else:
            canonical = await self._canonical_hash(tail, history, num)
        if canonical == want:
            return Plan(start=num, tail=tail, history=history, reason="match")
        fork = await self._fork_point(tail, history, want)
        if fork is not None:
            start, reason = fork
            return Plan(start=start, tail=tail, history=history, reason=reason)
        return Plan(
            start=max(0, num - self._threshold), tail=tail, history=history, reason="rewind"
        )

    def _history_pages(self, history: History, start: int, stop: int | None) -> Iterator[pa.Table]:
        """Lake pages from ``start``; the first one short, so the first block goes out soon."""
        pages = history.iter_canonical_arrow(self._stream, start, stop, batch_rows=self._batch_rows)
        return _short_first(pages, FIRST_PAGE)

    async def _canonical_hash(
        self, tail: TailIndex, history: History | None, num: int
    ) -> str | None:
        hit = tail.chain.get(num)
        if hit is not None:
            return hit[0]
        if history is None:
            return None
        row = await asyncio.to_thread(history.canonical_at, self._stream, num)
        return None if row is None else bytes(row.hash).hex()

    async def _lookup(
        self, tail: TailIndex, history: History | None, h: str
    ) -> tuple[int, str, bool] | None:
        """(num, parent, canonical) of a block hash, from the tail first, then the lake."""
        seen = tail.seen.get(h)
        if seen is not None:
            num, parent = seen[0], seen[1]
            in_chain = tail.chain.get(num)
            if in_chain is not None:
                return num, parent, in_chain[0] == h
            canonical = await self._canonical_hash(tail, history, num)
            return num, parent, canonical == h
        if history is None:
            return None
        row = await asyncio.to_thread(history.find_hash, self._stream, bytes.fromhex(h))
        if row is None:
            return None
        canonical = await self._canonical_hash(tail, history, row.num)
        return row.num, bytes(row.parent).hex(), canonical == h

    async def _fork_point(
        self, tail: TailIndex, history: History | None, want: str
    ) -> tuple[int, str] | None:
        found = await self._lookup(tail, history, want)
        if found is None:
            return None
        num, parent, canonical = found
        if canonical:
            return num, "hash"
        for _ in range(max(1, self._threshold)):
            found = await self._lookup(tail, history, parent)
            if found is None:
                return None
            anc_num, anc_parent, anc_canonical = found
            if anc_canonical:
                return anc_num + 1, "fork"
            parent = anc_parent
        return None

    async def get_block(self, num: int, keep: KeyTest | None = None) -> list[str] | None:
        """The canonical block at ``num`` as its JSON results, or None when unknown.

        One lookup in the shared tail index and one XRANGE of that entry (or
        one lake read), whatever the length of the tail. ``keep`` as for
        :meth:`stream` (a key filter or a dialect's encoding).
        """
        found = await self.get_block_raw(num)
        return None if found is None else encode_results(*found, keep)

    async def get_block_raw(self, num: int) -> tuple[dict[str, Any], int, str, str] | None:
        """(decoded map, num, hash hex, parent hex) of the canonical block at ``num``, or None."""
        if not 0 <= num <= MAX_BLOCK_NUM:
            raise BadParams(f"block number: 0 to {hex(MAX_BLOCK_NUM)}")
        tail = await self.scan_tail()
        hit = tail.chain.get(num)
        if hit is not None:
            h, parent, entry_id = hit
            entries = await _xrange(self._redis, self._key, min=entry_id, max=entry_id)
            if entries:
                raw = decode_raw(entries[0][1][ENTRY_FIELD])
                return raw, num, h, parent
        history = await asyncio.to_thread(self._open_history)
        if history is None:
            return None
        row = await asyncio.to_thread(history.canonical_at, self._stream, num)
        if row is None:
            return None
        return decode_raw(row.payload), num, row.hash.hex(), row.parent.hex()

    # --- stream ---------------------------------------------------------------

    async def blocks_from(
        self, num: int, hash: bytes, keep: KeyTest | None, sink: BlockSink
    ) -> None:
        plan = await self.resolve(num, hash)
        await self.stream(plan, keep, sink)

    async def stream(self, plan: Plan, keep: KeyTest | None, sink: BlockSink) -> None:
        sender = Sender(plan.start)
        tail = plan.tail
        lo = tail.lo
        pos = plan.start
        log.debug(
            "resume %s from %d: tail [%s, %d] up to %r", plan.reason, pos, lo, tail.hi, tail.last_id
        )
        if plan.history is not None and (lo is None or pos < lo):
            pos = await self._from_history(
                plan.history, pos, lo, keep, sink, sender, prefetched=plan.prefetched
            )
            if lo is not None and pos < lo and await _refresh(plan.history):
                # The lake looked shorter than Redis says it must be: read on at the latest version.
                pos = await self._from_history(plan.history, pos, lo, keep, sink, sender)
            log.debug("history sent up to %d", pos - 1)
        if lo is not None:
            if pos < lo and sender.sent:
                raise ResumptionError(
                    f"history gap: the lake ends at {pos - 1}, redis starts at {lo}",
                    public=HISTORY_GAP,
                )
            await self._from_tail(plan, max(pos, lo), keep, sink, sender)
        tail.chain.clear()  # the plan's snapshot is spent: live subscriptions hold none of it
        await self._replay_and_live(plan.history, tail.last_id, keep, sink, sender)

    async def _from_history(
        self,
        history: History,
        pos: int,
        stop: int | None,
        keep: KeyTest | None,
        sink: BlockSink,
        sender: Sender,
        *,
        prefetched: tuple[Iterator[pa.Table], list[Emit]] | None = None,
    ) -> int:
        if prefetched is not None:
            pages, first = prefetched
        else:
            pages = self._history_pages(history, pos, stop)
            first = None
        try:
            while True:
                if first is not None:
                    emits: list[Emit] | None = first
                    first = None
                else:
                    emits = await asyncio.to_thread(_next_page, pages, keep)
                if emits is None:
                    return pos
                expected = pos if sender.sent else emits[0].num
                if emits[0].num != expected or emits[-1].num - expected + 1 != len(emits):
                    emits = [
                        e for e in emits if sender.accept(e.num, e.hash, e.weight, e) is not None
                    ]
                    if emits and (
                        emits[0].num != expected or emits[-1].num - expected + 1 != len(emits)
                    ):
                        raise ResumptionError(
                            f"history gap in the lake after block {expected - 1}",
                            public=HISTORY_GAP,
                        )
                else:
                    for emit in emits:
                        sender.accept(emit.num, emit.hash, emit.weight, emit)
                if emits:
                    await sink.put(emits)
                    pos = emits[-1].num + 1
        finally:
            _close(pages)

    async def _from_tail(
        self, plan: Plan, pos: int, keep: KeyTest | None, sink: BlockSink, sender: Sender
    ) -> None:
        tail = plan.tail
        for chunk_start in range(pos, tail.hi + 1, PAGE):
            nums = [
                n
                for n in range(chunk_start, min(chunk_start + PAGE, tail.hi + 1))
                if n in tail.chain
            ]
            if not nums:
                continue
            wanted = {tail.chain[n][2]: n for n in nums}
            ids = sorted(wanted, key=_id_key)
            entries = await _xrange(self._redis, self._key, min=ids[0], max=ids[-1])
            payloads = {eid: f[ENTRY_FIELD] for eid, f in entries if eid in wanted}
            emits = []
            for n in nums:
                h, parent, eid = tail.chain[n]
                payload = payloads.get(eid)
                if payload is None:
                    payload = await self._payload_from_history(plan.history, n, h)
                raw = decode_raw(payload)
                emit = Emit(n, h, parent, [], 0, effective_weight(n, raw_weight(raw)))
                depth = sender.accept(n, h, emit.weight, emit)
                if depth is None:
                    continue
                emit.results, emit.reorg = encode_results(raw, n, h, parent, keep), depth
                emits.append(emit)
            if emits:
                await sink.put(emits)

    async def _payload_from_history(self, history: History | None, num: int, h: str) -> bytes:
        if history is not None:
            await _refresh(history)
            row = await asyncio.to_thread(history.find_hash, self._stream, bytes.fromhex(h))
            if row is not None:
                return bytes(row.payload)
        raise ResumptionError(
            f"block {num} was trimmed from redis and is not in the lake", public=HISTORY_GAP
        )

    async def _replay(
        self,
        history: History | None,
        last_id: bytes,
        keep: KeyTest | None,
        sink: BlockSink,
        sender: Sender,
    ) -> bytes:
        """Entries after ``last_id`` in production order, until a short page; returns the last id.

        Entries trimmed from Redis since ``last_id`` was read show up as a jump
        in block numbers: that range is read from the lake first.
        """
        while True:
            entries = await _xrange(
                self._redis, self._key, min="(" + last_id.decode(), max="+", count=PAGE
            )
            emits: list[Emit] = []
            for entry_id, fields in entries:
                last_id = entry_id
                try:
                    block = decode_servable(fields[ENTRY_FIELD])
                except (BadBatch, KeyError):
                    log.warning("skipping invalid chain entry %r", entry_id)
                    continue
                if (
                    sender.sent
                    and block.num > sender.head
                    and not sender.knows(block.num - 1, block.parent.hex())
                ):
                    if emits:
                        await sink.put(emits)
                        emits = []
                    await self._fill(history, block.num, block.parent.hex(), keep, sink, sender)
                item = LiveBlock.from_block(block, entry_id)
                emits.extend(sender.take(_live_emit(item, keep)))
            if emits:
                await sink.put(emits)
            if len(entries) < PAGE:
                return last_id

    async def _fill(
        self,
        history: History | None,
        stop: int,
        parent: str,
        keep: KeyTest | None,
        sink: BlockSink,
        sender: Sender,
    ) -> None:
        """Entries trimmed from Redis since they were scanned: read ``[.., stop)`` from the lake.

        The lake's canonical blocks from ``reorg_threshold`` below the point
        where Redis resumed are compared with what was sent: equal ones are
        skipped, others sent (as a reorg when they replace a sent block). The
        result must link to ``parent``, the parent of the next Redis entry.
        """
        if history is not None:
            await _refresh(history)
            start = max(0, min(sender.head + 1, stop) - 1 - self._threshold)
            pages = history.iter_canonical_arrow(self._stream, start, stop, batch_rows=PAGE)
            while (page := await asyncio.to_thread(_next_page, pages, keep)) is not None:
                emits = []
                for emit in page:
                    depth = sender.accept(emit.num, emit.hash, emit.weight, emit)
                    if depth is not None:
                        emit.reorg = depth
                        emits.append(emit)
                if emits:
                    await sink.put(emits)
        if sender.head != stop - 1 or sender.hash_at(stop - 1) != parent:
            raise ResumptionError(
                f"history gap: redis resumed at block {stop} but the lake does not link to it",
                public=HISTORY_GAP,
            )

    async def _replay_and_live(
        self,
        history: History | None,
        last_id: bytes,
        keep: KeyTest | None,
        sink: BlockSink,
        sender: Sender,
    ) -> None:
        last_id = await self._replay(history, last_id, keep, sink, sender)
        listener = _LiveListener(sender, keep, sink)
        self._hub.add(listener)
        try:
            for _ in range(_LIVE_ATTEMPTS):
                last_id = await self._replay(history, last_id, keep, sink, sender)
                if listener.go_live(last_id):
                    break
                listener.reset()  # the live buffer overflowed while replaying: replay again
            else:
                raise SlowConsumer("could not catch up with the live head")
            head = sender.head
            sink.ready(head, sender.hash_at(head) or "")
            checkpoint()
            await listener.failed
        finally:
            self._hub.discard(listener)


class _LiveListener:
    """Buffers live blocks (bounded) until the replay caught up, then feeds the sink directly."""

    def __init__(
        self, sender: Sender, keep: KeyTest | None, sink: BlockSink, *, limit: int = 4096
    ) -> None:
        self._sender = sender
        self._keep = keep
        self._sink = sink
        self._limit = limit
        self._buffer: list[LiveBlock] = []
        self._overflow = False
        self._live = False
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def reset(self) -> None:
        self._buffer.clear()
        self._overflow = False

    def go_live(self, last_id: bytes) -> bool:
        if self._overflow:
            return False
        last = _id_key(last_id)
        buffered, self._buffer = self._buffer, []
        self._live = True
        self._deliver([b for b in buffered if b.entry_id is None or _id_key(b.entry_id) > last])
        return True

    def offer(self, item: LiveBlock) -> None:
        if self.failed.done():
            return
        if not self._live:
            if len(self._buffer) >= self._limit:
                self._overflow = True
                self._buffer.clear()
            elif not self._overflow:
                self._buffer.append(item)
            return
        self._deliver([item])

    def _deliver(self, items: list[LiveBlock]) -> None:
        emits = []
        for item in items:
            emits.extend(self._sender.take(_live_emit(item, self._keep)))
        if not emits:
            return
        try:
            self._sink.put_nowait(emits)
        except SlowConsumer as exc:
            if not self.failed.done():
                self.failed.set_exception(exc)


async def _refresh(history: History) -> bool:
    """Move ``history`` to the latest lake version if it can; False when it cannot."""
    refresh = getattr(history, "refresh", None)
    if refresh is None:
        return False
    await asyncio.to_thread(refresh)
    return True


def _short_first(pages: Iterator[pa.Table], rows: int) -> Iterator[pa.Table]:
    """``pages`` with the first one split after ``rows`` rows; closing it closes ``pages``."""
    try:
        first = True
        for table in pages:
            if first and table.num_rows > rows:
                yield table.slice(0, rows)
                table = table.slice(rows)
            first = False
            yield table
    finally:
        _close(pages)


def _close(pages: Iterator[pa.Table]) -> None:
    close = getattr(pages, "close", None)
    if close is not None:
        try:
            close()
        except ValueError:
            pass  # still running in its thread after a cancel; it ends there


def _next_page(pages: Iterator[pa.Table], keep: KeyTest | None) -> list[Emit] | None:
    table = next(pages, None)
    if table is None:
        return None
    nums = table.column("num").to_pylist()
    hashes = table.column("hash").to_pylist()
    parents = table.column("parent").to_pylist()
    payloads = table.column("payload").to_pylist()
    out = []
    for n, h, p, b in zip(nums, hashes, parents, payloads, strict=True):
        raw = decode_raw(b)
        out.append(
            Emit(
                n, h, p, encode_results(raw, n, h, p, keep), 0, effective_weight(n, raw_weight(raw))
            )
        )
    return out


def _live_emit(item: LiveBlock, keep: KeyTest | None) -> Emit:
    return Emit(item.num, item.hash, item.parent, item.results(keep), 0, item.weight)


__all__ = [
    "BlockSink",
    "checkpoint",
    "decode_servable",
    "Emit",
    "History",
    "Plan",
    "Resumption",
    "Sender",
    "TailIndex",
    "TieredResumption",
]
