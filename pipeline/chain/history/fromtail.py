"""Catch-up from the Redis tail: the plan's snapshot of the canonical chain, read back by entry id.

Phase 3 of resumption (:mod:`pipeline.chain.history.resumption`): the
heights of the plan's :class:`~pipeline.chain.tailindex.TailIndex` from a
position up, read a page at a time (pages of about :data:`PAGE_BYTES`), decoded
and encoded a turn at a time (:mod:`pipeline.chain.history.turns`). An entry
trimmed from Redis since the plan was made is read from the lake instead.
"""

from __future__ import annotations

import asyncio

from pipeline.blockcodec import ENTRY_FIELD, KeyTest, decode_raw, effective_weight, raw_weight
from pipeline.chain.cardinal import encode_results
from pipeline.chain.forkchoice import Sender
from pipeline.chain.history.lakepages import HISTORY_GAP, refresh_history
from pipeline.chain.history.tail import PAGE
from pipeline.chain.history.turns import Turn, Turns
from pipeline.chain.planning import BlockSink, Emit, History, Plan, TailReads
from pipeline.errors import ResumptionError
from pipeline.redisio.conn import parse_entry_id

#: Heights a catch-up's first page reads; the next ones read :func:`page_after` heights.
FIRST_PAGE = 128
#: Bytes of payloads a page of a catch-up holds, about: a subscriber waiting for room holds
#: its page (16 duplexes of one Dialogue connection, each with a page of 1,000 blocks of
#: 2 KB, held 35 MB beside the connection's 8 MiB budget).
PAGE_BYTES = 512 << 10
#: Bytes of payloads encoded in one turn, at most (and one more block): the encoded blocks
#: of a turn are held until they fit the subscriber's queue (a 5 ms turn encoded about
#: 1.5 MB of 2 KB blocks).
TURN_BYTES = 128 << 10


def page_after(payloads: dict[bytes, bytes]) -> int:
    """Heights the next page reads: :data:`PAGE_BYTES` at this page's mean payload size,
    between 16 and the tail's :data:`~pipeline.chain.history.tail.PAGE`."""
    if not payloads:
        return FIRST_PAGE
    mean = sum(map(len, payloads.values())) / len(payloads)
    return max(16, min(PAGE, int(PAGE_BYTES / max(mean, 1.0))))


class TailCatchup:
    """Sends the tail's canonical blocks of a plan to one subscriber at a time; one per server."""

    def __init__(self, stream: str, entries: TailReads, turns: Turns) -> None:
        self._stream = stream
        self._entries = entries
        self._turns = turns

    async def send(
        self, plan: Plan, pos: int, keep: KeyTest | None, sink: BlockSink, sender: Sender
    ) -> None:
        """Send the heights ``[pos, plan.tail.hi]`` of the plan's chain into ``sink``.

        :class:`ResumptionError` when an entry was trimmed and the lake lacks its block.
        """
        tail = plan.tail
        size, chunk_start = FIRST_PAGE, pos
        while chunk_start <= tail.hi:
            stop = min(chunk_start + size, tail.hi + 1)
            nums = [n for n in range(chunk_start, stop) if n in tail.chain]
            chunk_start = stop
            if not nums:
                continue
            payloads = await self._payloads(plan, nums)
            size = page_after(payloads)
            # decoded and encoded a turn at a time (pipeline/chain/history/turns.py), each
            # turn at most TURN_BYTES of payloads
            i = 0
            while i < len(nums):
                emits, held = [], 0
                async with Turn(self._turns) as turn:
                    while i < len(nums) and held < TURN_BYTES and not turn.over():
                        n = nums[i]
                        i += 1
                        h, parent, eid = tail.chain[n]
                        payload = payloads.pop(eid)  # (what was sent is not held on)
                        held += len(payload)
                        raw = decode_raw(payload)
                        emit = Emit(n, h, parent, [], 0, effective_weight(n, raw_weight(raw)))
                        depth = sender.accept(n, h, emit.weight, emit)
                        if depth is None:
                            continue
                        emit.results, emit.reorg = encode_results(raw, n, h, parent, keep), depth
                        emits.append(emit)
                if emits:
                    await sink.put(emits)

    async def _payloads(self, plan: Plan, nums: list[int]) -> dict[bytes, bytes]:
        """The entries of heights ``nums`` of the plan's chain, by entry id."""
        tail = plan.tail
        # The page is read and parsed (about 10 ms for 1,000 entries) in a turn too:
        # 16 catch-ups parsing their pages in one loop iteration delayed live blocks
        # by seconds. The read is a bounded Redis call, never a wait for the subscriber.
        async with Turn(self._turns):
            wanted = {tail.chain[n][2]: n for n in nums}
            ids = sorted(wanted, key=parse_entry_id)
            entries = await self._entries.between(ids[0], ids[-1])
            payloads = {eid: f[ENTRY_FIELD] for eid, f in entries if eid in wanted}
        for n in nums:  # trimmed meanwhile: read from the lake (not while holding a turn)
            h, _parent, eid = tail.chain[n]
            if eid not in payloads:
                payloads[eid] = await self._payload_from_history(plan.history, n, h)
        return payloads

    async def _payload_from_history(self, history: History | None, num: int, h: str) -> bytes:
        if history is not None:
            await refresh_history(history)
            row = await asyncio.to_thread(history.find_hash, self._stream, bytes.fromhex(h))
            if row is not None:
                return bytes(row.payload)
        raise ResumptionError(
            f"block {num} was trimmed from redis and is not in the lake", public=HISTORY_GAP
        )


__all__ = ["TailCatchup"]
