"""The tail catch-up's pages: bounded in bytes, every height sent once and in order (pure:
an in-memory :class:`~pipeline.chain.planning.TailReads` and a list sink)."""

from __future__ import annotations

import dataclasses

from pipeline.blockcodec import ENTRY_FIELD, encode_block
from pipeline.chain.forkchoice import Sender
from pipeline.chain.history.fromtail import (
    FIRST_PAGE,
    PAGE_BYTES,
    TURN_BYTES,
    TailCatchup,
    page_after,
)
from pipeline.chain.history.tail import PAGE
from pipeline.chain.history.turns import Turns
from pipeline.chain.planning import Emit, Plan, Reason
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.tailindex import TailIndex
from pipeline.redisio.conn import parse_entry_id


class Reads:
    """Entries by id; records how many each ``between`` returned and their bytes."""

    def __init__(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        self.entries = entries
        self.pages: list[tuple[int, int]] = []

    async def between(self, first: bytes, last: bytes) -> list[tuple[bytes, dict[bytes, bytes]]]:
        lo, hi = parse_entry_id(first), parse_entry_id(last)
        out = [(i, f) for i, f in self.entries if lo <= parse_entry_id(i) <= hi]
        self.pages.append((len(out), sum(len(f[ENTRY_FIELD]) for _i, f in out)))
        return out

    async def after(self, last_id: bytes, count: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        raise AssertionError("not used by the catch-up")


class Sink:
    def __init__(self) -> None:
        self.nums: list[int] = []
        self.puts: list[int] = []

    async def put(self, emits: list[Emit]) -> None:
        self.nums.extend(e.num for e in emits)
        self.puts.append(len(emits))

    def put_nowait(self, emits: list[Emit]) -> None:
        raise AssertionError("catch-up only")

    def ready(self, num: int, hash: str) -> None:
        raise AssertionError("catch-up only")


def _chain(blocks: int, value: int | None) -> tuple[Plan, Reads]:
    tail, entries = TailIndex(), []
    for block in SyntheticChain(seed=5).take(blocks):
        updates = {} if value is None else {"v": bytes(value)}
        block = dataclasses.replace(block, updates=updates, deletes=())
        eid = f"{block.num + 1}-0".encode()
        tail.add(block.num, block.hash.hex(), block.parent.hex(), eid)
        entries.append((eid, {ENTRY_FIELD: encode_block(block)}))
    return Plan(0, tail, None, Reason.MATCH), Reads(entries)


async def _catch_up(blocks: int, value: int | None) -> tuple[Sink, Reads]:
    plan, reads = _chain(blocks, value)
    sink = Sink()
    await TailCatchup("s", reads, Turns()).send(plan, 0, None, sink, Sender(0))
    return sink, reads


async def test_pages_of_large_blocks_hold_about_page_bytes() -> None:
    """3,000 blocks of 4 KB: the first page reads FIRST_PAGE heights, the next ones about
    PAGE_BYTES (before: 1,000 heights, 4 MB, held by every subscriber waiting for room)."""
    sink, reads = await _catch_up(3000, 4096)
    assert sink.nums == list(range(3000))
    assert reads.pages[0][0] == FIRST_PAGE
    assert max(nbytes for _n, nbytes in reads.pages[1:]) <= PAGE_BYTES * 1.05
    assert sum(n for n, _b in reads.pages) == 3000
    # and each put holds one turn of at most TURN_BYTES of payloads (and one block more):
    # before, a 5 ms turn (about 1.5 MB of such blocks encoded) waited for room whole
    block = reads.pages[0][1] / reads.pages[0][0]
    assert max(sink.puts) <= TURN_BYTES / block + 1
    assert max(sink.puts) * block <= 256 << 10  # whatever TURN_BYTES says


async def test_small_blocks_read_whole_pages() -> None:
    sink, reads = await _catch_up(2500, None)
    assert max(nbytes / n for n, nbytes in reads.pages) < PAGE_BYTES / PAGE
    assert sink.nums == list(range(2500))
    assert [n for n, _b in reads.pages] == [FIRST_PAGE, PAGE, PAGE, 2500 - FIRST_PAGE - 2 * PAGE]


def test_the_next_page_follows_the_mean_payload() -> None:
    assert page_after({}) == FIRST_PAGE
    assert page_after({b"1": b"x" * 1024}) == PAGE_BYTES // 1024
    assert page_after({b"1": b"x" * (64 << 20)}) == 16
    assert page_after({b"1": b""}) == PAGE
