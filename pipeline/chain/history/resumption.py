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
   table through the JVM-free :class:`~pipeline.lake.storage.reader.LakeReader`,
   checked to be contiguous.
3. Tail: the tail's canonical chain ``[max(start, tail.lo), tail.hi]``, read
   back from Redis by entry id (an entry trimmed meanwhile is read from the
   lake instead).
4. Replay and live: entries after the scan's last id, in production order,
   page by page until caught up; then the sink is registered with the live
   hub *before* a last replay, and live blocks already replayed are skipped
   (by entry id, and by the :class:`Sender` window of sent hashes). When the
   hub's feed has read the stream no further than where the plan's tail ends
   (:meth:`~pipeline.chain.produce.producer.WebsocketHub.covers`), everything after it
   will be published to a listener added now: both replays are skipped, and
   resolve uses the tail index without refreshing it first (a subscribe at
   the head reads Redis not at all).

Where each concern lives: the pure parts (:class:`Sender`, :class:`TailIndex`,
:class:`Plan` and its :class:`Reason`, the ports :class:`History`,
:class:`TailReads` and :class:`BlockSink`) in :mod:`pipeline.chain.planning`;
the Redis tail (:class:`SharedTail` and the :class:`RedisTail` adapter) in
:mod:`pipeline.chain.history.tail`; lake pages in :mod:`pipeline.chain.history.lakepages`;
the live listener in :mod:`pipeline.chain.history.live` (the hub is
:class:`~pipeline.chain.produce.producer.WebsocketHub`). This module wires them.

Every emitted block goes through one :class:`Sender`, which drops a block
whose hash was already sent at that height, holds blocks of production order
(replay, live) that are not heavier than what was sent, and sends a heavier
branch with its held blocks, the first marked as a reorg of the given depth
above the common ancestor.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pyarrow as pa
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import (
    ENTRY_FIELD,
    KeyTest,
    decode_raw,
    effective_weight,
    raw_weight,
)
from pipeline.chain.cardinal import encode_results
from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.lakepages import (
    ENCODE_ROWS,
    close_pages,
    drop_read,
    next_page,
    page_emits,
    refresh_history,
)
from pipeline.chain.history.live import LIVE_ATTEMPTS, LiveGroups, LiveListener, live_emit
from pipeline.chain.history.resolve import Locator
from pipeline.chain.history.shared import SharedResults, shape_of
from pipeline.chain.history.tail import PAGE, RedisTail, SharedTail
from pipeline.chain.history.turns import Turn, Turns
from pipeline.chain.planning import (
    BlockSink,
    Emit,
    History,
    Plan,
    Sender,
    TailIndex,
    TailReads,
    decode_servable,
)
from pipeline.chain.produce.producer import LiveBlock, WebsocketHub
from pipeline.errors import BadBatch, ResumptionError, SlowConsumer
from pipeline.redisio.conn import checkpoint, parse_entry_id

log = logging.getLogger(__name__)

#: What a subscriber is told when history has a hole (details go to the log).
HISTORY_GAP = "history gap: blocks missing between the lake and redis, resubscribe later"


class Resumption(Protocol):
    async def blocks_from(
        self, num: int, hash: bytes, keep: KeyTest | None, sink: BlockSink
    ) -> None:
        """Deliver blocks from ``num`` (see the module doc) until cancelled or failed."""


class TieredResumption:
    """Delta history, then the Redis tail, then the live hub (see the module doc)."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        stream: str,
        hub: WebsocketHub,
        history_factory: Callable[[], History | None] | None = None,
        reorg_threshold: int = 64,
        max_tail: int = 1_000_000,
        batch_rows: int = 8192,
        refused: Refusals | None = None,
        turns: Turns | None = None,
        shared: SharedResults | None = None,
    ) -> None:
        #: Event-loop time shared by catch-ups (pipeline/chain/history/turns.py).
        self.turns = turns if turns is not None else Turns()
        #: Lake blocks encoded once for concurrent catch-ups (pipeline/chain/history/shared.py).
        self.shared = shared if shared is not None else SharedResults()
        #: Catch-ups reading the lake now: the shared results are used while two or more do.
        self._reading = 0
        self._stream = stream
        self._key = keys.stream(stream)
        self._hub = hub
        #: live subscribers in one fork-choice state take each block at once (one per hub)
        if not isinstance(hub.groups, LiveGroups):
            hub.groups = LiveGroups()
        self._groups: LiveGroups = hub.groups
        self._history_factory = history_factory
        self._threshold = reorg_threshold
        self._max_tail = max_tail
        self._batch_rows = batch_rows
        self._refused = refused if refused is not None else Refusals()
        self._tail = SharedTail(redis, self._key, max_entries=max_tail, refused=self._refused)
        self._entries: TailReads = RedisTail(redis, self._key, self._refused)
        self._locator = Locator(
            stream=stream,
            tail=self._tail,
            entries=self._entries,
            history_factory=history_factory,
            reorg_threshold=reorg_threshold,
            batch_rows=batch_rows,
        )

    # --- resolve (pipeline.chain.history.resolve) ----------------------------------------

    async def scan_tail(self) -> TailIndex:
        """The shared tail index, brought up to date; it may change at the caller's next await."""
        return await self._locator.scan_tail()

    async def warm(self) -> None:
        """Index the Redis tail now (a server calls it at start so no client pays for it)."""
        await self._locator.warm()

    async def resolve(self, num: int, hash: bytes, keep: KeyTest | None = None) -> Plan:
        """Where to start for a client at (``num``, ``hash``): :meth:`Locator.resolve`.

        The tail index is not refreshed first when it holds everything the live
        feed published (:meth:`WebsocketHub.covers`) and the block is canonical in
        it: one Redis round trip less per subscribe (``subscribe_cpu_ms`` of
        ``make bench B=resume``); entries newer than the index are replayed.
        """
        covered = self._hub.covers(self._tail.index.last_id)
        return await self._locator.resolve(num, hash, keep, refresh=not covered)

    async def get_block(self, num: int, keep: KeyTest | None = None) -> list[str] | None:
        """The canonical block at ``num`` as its JSON results: :meth:`Locator.get_block`."""
        return await self._locator.get_block(num, keep)

    async def get_block_raw(self, num: int) -> tuple[dict[str, Any], int, str, str] | None:
        """(decoded map, num, hash hex, parent hex) at ``num``: :meth:`Locator.get_block_raw`."""
        return await self._locator.get_block_raw(num)

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
            if lo is not None and pos < lo:
                # The lake looked shorter than Redis says it must be: read on at the latest version.
                await refresh_history(plan.history)
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
            pages = self._locator.history_pages(history, pos, stop)
            first = None
        # The Arrow read (parquet, in C++) runs in a thread; the page is encoded here, in
        # slices of ENCODE_ROWS. Encoding in the thread as well made the decoding thread and
        # the writer (one send per frame) trade the GIL at every frame:
        # catchup_blocks_per_s of make bench B=resume, about 13% lower over six interleaved runs.
        # The next page is read while this one is encoded (one page ahead, no more): a
        # file's read then overlaps the encoding instead of stalling the catch-up.
        table: pa.Table | None = None
        read = functools.partial(
            asyncio.get_running_loop().run_in_executor, None, next, pages, None
        )
        ahead: asyncio.Future[pa.Table | None] | None = None
        shape = shape_of(keep)
        self._reading += 1
        try:
            ahead = read()
            while True:
                if first is not None:
                    emits = first
                    first = None
                else:
                    if table is None or table.num_rows == 0:
                        assert ahead is not None  # None only once the pages ran out
                        table = await ahead
                        if table is None:
                            ahead = None
                            return pos
                        ahead = read()
                    async with Turn(self.turns):
                        shared = self.shared if self._reading > 1 else None
                        emits = page_emits(table.slice(0, ENCODE_ROWS), keep, shared, shape)
                    table = table.slice(ENCODE_ROWS)
                if not emits:
                    continue  # every block of the slice was skipped (see page_emits)
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
                elif emits[0].num > sender.head:
                    sender.extend(emits)
                else:
                    for emit in emits:
                        sender.accept(emit.num, emit.hash, emit.weight, emit)
                if emits:
                    await sink.put(emits)
                    pos = emits[-1].num + 1
        finally:
            self._reading -= 1
            if self._reading < 2:
                self.shared.clear()  # nobody to share with: an idle server keeps none of it
            if ahead is not None:
                drop_read(ahead)
            close_pages(pages)

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
            # The page is read and parsed (about 10 ms for 1,000 entries) in a turn too:
            # 16 catch-ups parsing their pages in one loop iteration delayed live blocks
            # by seconds. The read is a bounded Redis call, never a wait for the subscriber.
            async with Turn(self.turns):
                wanted = {tail.chain[n][2]: n for n in nums}
                ids = sorted(wanted, key=parse_entry_id)
                entries = await self._entries.between(ids[0], ids[-1])
                payloads = {eid: f[ENTRY_FIELD] for eid, f in entries if eid in wanted}
            for n in nums:  # trimmed meanwhile: read from the lake (not while holding a turn)
                h, _parent, eid = tail.chain[n]
                if eid not in payloads:
                    payloads[eid] = await self._payload_from_history(plan.history, n, h)
            i = 0
            while i < len(
                nums
            ):  # decoded and encoded a turn at a time (pipeline/chain/history/turns.py)
                emits = []
                async with Turn(self.turns) as turn:
                    while i < len(nums) and not turn.over():
                        n = nums[i]
                        i += 1
                        h, parent, eid = tail.chain[n]
                        raw = decode_raw(payloads[eid])
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
            await refresh_history(history)
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
            turn = Turn(
                self.turns
            )  # read and decoded a turn at a time (pipeline/chain/history/turns.py)
            emits: list[Emit] = []
            try:
                await turn.acquire()
                entries = await self._entries.after(last_id, PAGE)
                for entry_id, fields in entries:
                    if turn.held and turn.over():
                        turn.release()
                        if emits:
                            await sink.put(emits)
                            emits = []
                    await turn.acquire()
                    last_id = entry_id
                    try:
                        block = decode_servable(fields[ENTRY_FIELD])
                    except (BadBatch, KeyError) as exc:
                        self._refused(entry_id, exc)
                        continue
                    if (
                        sender.sent
                        and block.num > sender.head
                        and not sender.knows(block.num - 1, block.parent.hex())
                    ):
                        turn.release()
                        if emits:
                            await sink.put(emits)
                            emits = []
                        linked = await self._fill(
                            history, block.num, block.parent.hex(), keep, sink, sender
                        )
                        await turn.acquire()
                        if not linked:  # on a branch the lake says lost: never sent
                            sender.lose(block.hash.hex())
                            continue
                    item = LiveBlock.from_block(block, entry_id)
                    emits.extend(sender.take(live_emit(item, keep)))
            finally:
                turn.release()
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
    ) -> bool:
        """Entries trimmed from Redis since they were scanned: read ``[.., stop)`` from the lake.

        The lake's canonical blocks from ``reorg_threshold`` below the point
        where Redis resumed are compared with what was sent: equal ones are
        skipped, others sent (as a reorg when they replace a sent block). The
        result must link to ``parent``, the parent of the next Redis entry,
        unless the lake holds ``parent`` as a block that is not canonical: then
        the entry is on a branch that lost (its lighter blocks were trimmed with
        the others), and False says so. Anything else is a history gap.
        """
        if history is not None:
            await refresh_history(history)
            start = max(0, min(sender.head + 1, stop) - 1 - self._threshold)
            pages = history.iter_canonical_arrow(self._stream, start, stop, batch_rows=PAGE)
            while (page := await asyncio.to_thread(next_page, pages, keep)) is not None:
                emits = []
                for emit in page:
                    depth = sender.accept(emit.num, emit.hash, emit.weight, emit)
                    if depth is not None:
                        emit.reorg = depth
                        emits.append(emit)
                if emits:
                    await sink.put(emits)
        if sender.head == stop - 1 and sender.hash_at(stop - 1) == parent:
            return True
        if history is not None:
            row = await asyncio.to_thread(history.find_hash, self._stream, bytes.fromhex(parent))
            if row is not None and row.num == stop - 1 and not row.canonical:
                return False
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
        # The hub's feed has read no further than last_id: whatever comes after it will
        # be offered to a listener added now (no await in between), so neither replay
        # can find anything (two Redis reads less per subscribe at the head: subscribe_cpu_ms
        # of make bench B=resume).
        covered = self._hub.covers(last_id)
        if not covered:
            last_id = await self._replay(history, last_id, keep, sink, sender)
        listener = LiveListener(sender, keep, sink, groups=self._groups)
        self._hub.add(listener)
        try:
            for attempt in range(LIVE_ATTEMPTS):
                if not (covered and attempt == 0):
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
            listener.close()
            self._hub.discard(listener)


__all__ = ["HISTORY_GAP", "Resumption", "TieredResumption"]
