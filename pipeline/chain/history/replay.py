"""Replay: the Redis entries after an id, in production order, with what was trimmed read from the lake.

Phase 4 of resumption before live (:mod:`pipeline.chain.history.resumption`):
every entry after the plan's last id goes through the subscriber's
:class:`~pipeline.chain.forkchoice.Sender` (fork choice, production order),
read and decoded a turn at a time (:mod:`pipeline.chain.history.turns`).
Entries trimmed from Redis meanwhile show up as a jump in block numbers
(above what was sent, or above the plan's start when nothing was): that
range is read from the lake first (:meth:`Replay._fill`).
"""

from __future__ import annotations

import asyncio

from pipeline.blockcodec import ENTRY_FIELD, Block, KeyTest, effective_weight
from pipeline.chain.forkchoice import Sender
from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.lakepages import (
    ENCODE_BYTES,
    HISTORY_GAP,
    byte_pages,
    next_page,
    refresh_history,
    rows_emits,
)
from pipeline.chain.history.live import live_emit
from pipeline.chain.history.seam import walk_branch
from pipeline.chain.history.tail import PAGE, SharedTail
from pipeline.chain.history.turns import Turn, Turns
from pipeline.chain.planning import BlockSink, Emit, History, TailReads
from pipeline.chain.produce.producer import LiveBlock
from pipeline.chain.tailindex import decode_servable
from pipeline.errors import BadBatch, BranchUnlinked, ResumptionError


class Replay:
    """Replays a stream's entries to one subscriber at a time; one per server."""

    def __init__(
        self,
        *,
        stream: str,
        entries: TailReads,
        turns: Turns,
        refused: Refusals,
        reorg_threshold: int,
        tail: SharedTail | None = None,
    ) -> None:
        self._stream = stream
        #: the server's tail index: which of two branches Redis holds is the heaviest
        self._tail = tail
        self._entries = entries
        self._turns = turns
        self._refused = refused
        self._threshold = reorg_threshold

    async def run(
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
                self._turns
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
                    block = self._decode(entry_id, fields)
                    if block is None:
                        continue
                    # A jump: above the head, not linked to what was sent. With nothing
                    # sent yet, any block above the plan's start is one (a plan on a stale
                    # tail index whose next entries were trimmed: history checker seed 1068).
                    if (
                        block.num > sender.head
                        and (sender.sent or block.num > sender.head + 1)
                        and not sender.knows(block.num - 1, block.parent.hex())
                    ):
                        turn.release()
                        if emits:
                            await sink.put(emits)
                            emits = []
                        linked = await self._fill(history, block, keep, sink, sender)
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

    def _decode(self, entry_id: bytes, fields: dict[bytes, bytes]) -> Block | None:
        """The entry's block, or None when refused (malformed, or a height that lies)."""
        try:
            block = decode_servable(fields[ENTRY_FIELD])
        except (BadBatch, KeyError) as exc:
            self._refused(entry_id, exc)
            return None
        if not self._refused.admit(entry_id, block.num, block.hash.hex(), block.parent.hex()):
            return None
        return block

    async def _fill(
        self,
        history: History | None,
        block: Block,
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
        the others), and False says so. Otherwise the block may be on a branch
        forking below what the subscriber's Sender remembers: the first time,
        :class:`~pipeline.errors.BranchUnlinked` makes resumption plan again from
        the subscriber's head; the same block again is a history gap.
        """
        stop, parent = block.num, block.parent.hex()
        if history is not None:
            await refresh_history(history)
            start = max(0, min(sender.head + 1, stop) - 1 - self._threshold)
            # pages bounded in bytes as well: each is held, encoded, while the subscriber
            # has no room for it
            pages = byte_pages(
                history.iter_canonical_arrow(self._stream, start, stop, batch_rows=PAGE),
                PAGE,
                ENCODE_BYTES,
            )
            while (page := await asyncio.to_thread(next_page, pages, keep)) is not None:
                emits = sender.accepted(page)
                if emits:
                    await sink.put(emits)
        if sender.head == stop - 1 and sender.hash_at(stop - 1) == parent:
            return True
        if history is not None:
            row = await asyncio.to_thread(history.find_hash, self._stream, bytes.fromhex(parent))
            if row is not None and row.num == stop - 1 and not row.canonical:
                return await self._late_branch(history, block, keep, sender)
        if sender.first_unlinked(block.hash.hex()):
            raise BranchUnlinked(stop, block.hash.hex())
        raise ResumptionError(
            f"history gap: redis resumed at block {stop} but the lake does not link to it",
            public=HISTORY_GAP,
        )

    async def _late_branch(
        self, history: History, block: Block, keep: KeyTest | None, sender: Sender
    ) -> bool:
        """The entry's parent is in the lake, not marked canonical: on a branch that lost
        (False), or on one the lake's flags lag (:mod:`pipeline.chain.history.seam`: a tie
        the canonical job marked the other way, then broken by this entry's branch).

        The entry is on a branch that lost when the server's tail index (refreshed:
        fork choice over all Redis holds now) has another block at its height, or
        the lake's canonical head is at least as heavy as the entry. Where the index
        does not know the height, the lake's flags decide: lost when the lake marks
        no block at the parent's height. Otherwise its ancestors the lake does not
        mark are read by hash and held, and fork choice (:meth:`Sender.take`) sends
        them with the entry, as a reorg, when the entry is heavier than what the
        subscriber holds (history checker seed 1028: the entry was dropped as lost,
        and its subscriber with it; every later block descends from it, so the
        subscriber stalled for good).
        """
        verdict = await self._on_tail_chain(block)
        if verdict is False:
            return False
        if verdict is None:
            marked = await asyncio.to_thread(history.canonical_at, self._stream, block.num - 1)
            if marked is None:
                return False
        walked = await asyncio.to_thread(
            walk_branch, history, self._stream, block.parent.hex(), block.num - 1
        )
        if not walked:
            return False
        head = await asyncio.to_thread(history.head, self._stream)
        if head is not None and effective_weight(head.num, head.weight) >= effective_weight(
            block.num, block.weight
        ):
            return False
        for emit in rows_emits(walked, keep):
            sender.hold(emit)
        return True

    async def _on_tail_chain(self, block: Block) -> bool | None:
        """Whether ``block`` is on the tail index's heaviest chain; None when that is not
        known: no index, a refresh skipped (readers held it), a block the index has not
        seen or no block at its height there."""
        if self._tail is None or not await self._tail.refresh():
            return None
        index, hash = self._tail.index, block.hash.hex()
        hit = index.chain.get(block.num)
        if hit is None or hash not in index.seen:
            return None
        return hit[0] == hash


__all__ = ["Replay"]
