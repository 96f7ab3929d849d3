"""The seam below the Redis tail, where the lake's canonical flags lag (pure: an in-memory lake)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.chain.history.seam import LAKE_WALK, seam_of, walk_branch
from pipeline.chain.tailindex import TailIndex

STREAM = "chain:s"


@dataclass
class Row:
    num: int
    hash: bytes
    parent: bytes
    canonical: bool
    payload: bytes = b""


class Lake:
    """find_hash and canonical_at over rows, as the lake reader answers them."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = {r.hash: r for r in rows}
        self.lookups = 0

    def find_hash(self, stream: str, hash: bytes) -> Row | None:
        self.lookups += 1
        return self.rows.get(hash)

    def canonical_at(self, stream: str, num: int) -> Row | None:
        return next((r for r in self.rows.values() if r.num == num and r.canonical), None)


def h(tag: str, num: int) -> bytes:
    return f"{tag}{num}".encode().ljust(32, b".")


def branch(tag: str, start: int, stop: int, parent: bytes, canonical: bool) -> list[Row]:
    out = []
    for num in range(start, stop):
        out.append(Row(num, h(tag, num), parent, canonical))
        parent = out[-1].hash
    return out


def tail_on(parent: bytes, num: int) -> TailIndex:
    tail = TailIndex()
    tail.add(num, h("t", num).hex(), parent.hex(), b"1-0")
    return tail


BASE = branch("b", 0, 16, b"\0" * 32, True)
OLD = branch("o", 16, 21, BASE[-1].hash, True)
NEW = branch("n", 16, 21, BASE[-1].hash, False)


def test_the_seam_is_the_unmarked_branch_the_tail_extends() -> None:
    seam = seam_of(Lake(BASE + OLD + NEW), STREAM, tail_on(NEW[-1].hash, 21))
    assert seam is not None and seam.lo == 16
    assert [r[1] for r in seam.rows] == [r.hash.hex() for r in NEW]
    assert seam.hash_at(18) == NEW[2].hash.hex() and seam.hash_at(15) is None
    assert seam.hash_at(21) is None
    assert [r[0] for r in seam.rows_from(19)] == [19, 20]


def test_no_seam_when_the_lake_agrees_with_the_tail_in_one_read() -> None:
    lake = Lake(BASE + OLD + NEW)
    assert seam_of(lake, STREAM, tail_on(OLD[-1].hash, 21)) is None
    assert lake.lookups == 0  # canonical_at only
    assert seam_of(lake, STREAM, TailIndex()) is None


def test_a_walk_that_meets_a_hole_a_lying_height_or_no_end_finds_nothing() -> None:
    holed = [r for r in BASE + OLD + NEW if r.hash != NEW[2].hash]
    assert seam_of(Lake(holed), STREAM, tail_on(NEW[-1].hash, 21)) is None
    lying = BASE + OLD + NEW[:-1] + [Row(25, NEW[-1].hash, NEW[-2].hash, False)]
    assert walk_branch(Lake(lying), STREAM, NEW[-1].hash.hex(), 20) is None
    long = branch("x", 0, LAKE_WALK + 5, b"\1" * 32, False)
    assert walk_branch(Lake(long), STREAM, long[-1].hash.hex(), LAKE_WALK + 4) is None


def test_a_canonical_block_walks_to_nothing_and_genesis_ends_a_walk() -> None:
    assert walk_branch(Lake(BASE), STREAM, BASE[5].hash.hex(), 5) == []
    unmarked = branch("u", 0, 3, b"\0" * 32, False)
    rows = walk_branch(Lake(unmarked), STREAM, unmarked[-1].hash.hex(), 2)
    assert rows is not None and [r[0] for r in rows] == [0, 1, 2]
