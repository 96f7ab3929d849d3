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

Where each concern lives: the pure parts (:class:`Plan` and its :class:`Reason`,
the ports :class:`History`, :class:`TailReads` and :class:`BlockSink`) in
:mod:`pipeline.chain.planning`, :class:`Sender` in :mod:`pipeline.chain.forkchoice`,
:class:`TailIndex` in :mod:`pipeline.chain.tailindex`; the Redis tail
(:class:`SharedTail` and the :class:`RedisTail` adapter) in
:mod:`pipeline.chain.history.tail`; the phases in
:mod:`pipeline.chain.history.fromlake` (2), :mod:`pipeline.chain.history.fromtail` (3)
and :mod:`pipeline.chain.history.replay` (4, before live); lake pages in
:mod:`pipeline.chain.history.lakepages`; the live listener in
:mod:`pipeline.chain.history.live` (the hub is
:class:`~pipeline.chain.produce.producer.WebsocketHub`). This module wires them.

Every emitted block goes through one :class:`Sender`, which drops a block
whose hash was already sent at that height, holds blocks of production order
(replay, live) that are not heavier than what was sent, and sends a heavier
branch with its held blocks, the first marked as a reorg of the given depth
above the common ancestor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import KeyTest
from pipeline.chain.forkchoice import Sender
from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.fromlake import LakeCatchup
from pipeline.chain.history.fromtail import TailCatchup
from pipeline.chain.history.lakepages import HISTORY_GAP, close_pages, refresh_history
from pipeline.chain.history.live import LIVE_ATTEMPTS, LiveGroups, LiveListener
from pipeline.chain.history.replay import Replay
from pipeline.chain.history.resolve import Locator
from pipeline.chain.history.shared import SharedResults
from pipeline.chain.history.tail import RedisTail, SharedTail
from pipeline.chain.history.turns import Turns
from pipeline.chain.planning import BlockSink, History, Plan, TailReads
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.chain.tailindex import TailIndex
from pipeline.errors import BranchUnlinked, ResumptionError, SlowConsumer
from pipeline.redisio.conn import checkpoint

log = logging.getLogger(__name__)


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
        #: subscriptions planned again after a reorg their fork choice could not link
        self.resyncs = 0
        #: Event-loop time shared by catch-ups (pipeline/chain/history/turns.py).
        self.turns = turns if turns is not None else Turns()
        #: Lake blocks encoded once for concurrent catch-ups (pipeline/chain/history/shared.py).
        self.shared = shared if shared is not None else SharedResults()
        self._key = keys.stream(stream)
        self._hub = hub
        #: live subscribers in one fork-choice state take each block at once (one per hub)
        if not isinstance(hub.groups, LiveGroups):
            hub.groups = LiveGroups()
        self._groups: LiveGroups = hub.groups
        self._history_factory = history_factory
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
        self._from_lake = LakeCatchup(self._locator, self.turns, self.shared)
        self._from_tail = TailCatchup(stream, self._entries, self.turns)
        self._replay = Replay(
            stream=stream,
            entries=self._entries,
            turns=self.turns,
            refused=self._refused,
            reorg_threshold=reorg_threshold,
            tail=self._tail,
        )

    # --- resolve (pipeline.chain.history.resolve) ----------------------------------------

    async def scan_tail(self) -> TailIndex:
        """The shared tail index, brought up to date; it may change at the caller's next await."""
        return await self._locator.scan_tail()

    async def warm(self) -> None:
        """Index the Redis tail now (a server calls it at start so no client pays for it)."""
        await self._locator.warm()

    async def resolve(self, num: int, hash: bytes, keep: KeyTest | None) -> Plan:
        """Where to start for a client at (``num``, ``hash``): :meth:`Locator.resolve`.

        ``keep`` has no default: a plan's first lake page is encoded as it is read, so a
        caller that forgets the subscriber's encoding sends it blocks in the wrong
        dialect (history checker seed 1009).

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
        plan = await self.resolve(num, hash, keep)
        await self.stream(plan, keep, sink)

    async def stream(self, plan: Plan, keep: KeyTest | None, sink: BlockSink) -> None:
        """Deliver the plan's blocks, then live ones, until cancelled or failed.

        A heavier block whose branch the subscriber's Sender cannot link
        (:class:`~pipeline.errors.BranchUnlinked`: a reorg forking below what it
        holds, however deep) makes a new plan from the subscriber's head: its
        hash, now on a replaced branch, resolves to the exact fork point (Redis
        or the lake), and the new branch is sent from there, each block once,
        the first marked as the reorg.
        """
        sender = Sender(plan.start)
        while True:
            try:
                await self._stream_plan(plan, keep, sink, sender)
                return
            except BranchUnlinked as exc:
                self.resyncs += 1
                head = sender.head
                log.debug(
                    "resume again from %d: %s (subscription %s)",
                    head,
                    exc,
                    getattr(sink, "id", "?"),
                )
                if plan.history is not None:  # the lake may have marked the reorg since
                    await refresh_history(plan.history)
                # (with keep: a plan's first lake page comes encoded, in the subscriber's
                # dialect; without it a cardinal subscriber got seed-shaped batches, seed 1009)
                at = bytes.fromhex(sender.hash_at(head) or "")
                plan = await self._locator.resolve(head, at, keep)

    async def _stream_plan(
        self, plan: Plan, keep: KeyTest | None, sink: BlockSink, sender: Sender
    ) -> None:
        tail = plan.tail
        lo = tail.lo
        pos = plan.start
        log.debug(
            "resume %s from %d: tail [%s, %d] up to %r (subscription %s)",
            plan.reason,
            pos,
            lo,
            tail.hi,
            tail.last_id,
            getattr(sink, "id", "?"),
        )
        if plan.history is not None and (lo is None or pos < lo):
            pos = await self._send_history(plan, plan.history, pos, keep, sink, sender)
        if lo is not None:
            if pos < lo and sender.sent:
                raise ResumptionError(
                    f"history gap: the lake ends at {pos - 1}, redis starts at {lo}",
                    public=HISTORY_GAP,
                )
            await self._from_tail.send(plan, max(pos, lo), keep, sink, sender)
        tail.chain.clear()  # the plan's snapshot is spent: live subscriptions hold none of it
        await self._replay_and_live(plan.history, tail.last_id, keep, sink, sender)

    async def _send_history(
        self,
        plan: Plan,
        history: History,
        pos: int,
        keep: KeyTest | None,
        sink: BlockSink,
        sender: Sender,
    ) -> int:
        """The lake's blocks from ``pos`` up to the tail (the seam's, by hash, where the
        lake does not mark them yet); the next position."""
        lo, seam = plan.tail.lo, plan.seam
        stop = lo if seam is None else seam.lo
        if stop is None or pos < stop:
            pos = await self._from_lake.send(
                history, pos, stop, keep, sink, sender, prefetched=plan.prefetched
            )
            if stop is not None and pos < stop:
                # The lake looked shorter than Redis says it must be: read on at the latest version.
                await refresh_history(history)
                pos = await self._from_lake.send(history, pos, stop, keep, sink, sender)
        elif plan.prefetched is not None:
            close_pages(plan.prefetched[0])
        if seam is not None and pos >= seam.lo:
            pos = await self._from_lake.send_seam(seam, pos, keep, sink, sender)
        log.debug("history sent up to %d", pos - 1)
        return pos

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
            last_id = await self._replay.run(history, last_id, keep, sink, sender)
        listener = LiveListener(sender, keep, sink, groups=self._groups)
        self._hub.add(listener)
        try:
            for attempt in range(LIVE_ATTEMPTS):
                if not (covered and attempt == 0):
                    last_id = await self._replay.run(history, last_id, keep, sink, sender)
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
