"""Heights that cannot lie: the new blocks of an archive whose height is not their parent's plus one.

Every writer of ``blocks`` (:mod:`~pipeline.lake.write.arrowfix` for the
Arrow writer's files, :mod:`~pipeline.lake.write.mergewrite`,
:mod:`~pipeline.lake.write.sparkwrite`) asks :func:`set_aside` which of the
rows it is about to add must stay out, and treats those like a repeat of a
hash: no ``blocks`` row, the block kept whole in its entry's ``fields``
(``payload_in_blocks = false``). So a set-aside block is still archived, as
a raw entry of ``stream_entries``, and is never a chain block: nothing reads
it as one, and the canonical walk never meets it.

A block is set aside when its parent is known and the parent's height is not
its own minus one (a *bad* height), and so is every block above it: a block
whose parent was set aside, in this batch or by an earlier run. The parent is
looked for, in this order:

1. among the batch's own new blocks (and ``context``: blocks of the batch a
   caller does not ask about);
2. in ``blocks`` at the heights an honest parent would have (files pruned by
   ``num``), and in ``stream_entries`` at those heights for a parent an
   earlier run set aside (an entry with the hash, a valid block, no
   ``blocks`` row);
3. in ``blocks`` by hash alone (:func:`~pipeline.lake.storage.chainwalk.parent_heights`,
   every file of the stream), for the parents still missing: what makes a
   bad height pointing far down visible. An honest interval misses none (its
   first block's parent is the previous interval's last, one height down),
   so only the first interval of a stream, one after a gap, or one with a
   block whose parent is nowhere pays for it.

A parent found nowhere is unknown (a gap, the chain's first block): the
block is written, as always. Pure planning over Arrow plus those delta-rs
reads; no Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.storage import store, tables
from pipeline.lake.storage.chainwalk import parent_heights
from pipeline.lake.storage.intervalstats import interval_scan
from pipeline.settings import LakeSettings

#: Hashes of bad blocks a result and its log line name (the count is exact).
NAMED = 5
#: Heights one pruned read of step 2 spans at most; wider gaps between wanted heights
#: split it into several reads (a block far from the others gets its own).
SPAN = 4096
#: Pruned reads of step 2 per table at most; the heights beyond go to step 3.
MAX_READS = 8

_EMPTY_IDS = pa.array([], pa.string())
#: The columns :func:`set_aside` judges, in the types it compares them in.
ROWS = pa.schema(
    [("entry_id", pa.string()), ("num", pa.int64()), ("hash", pa.string()), ("parent", pa.string())]
)


@dataclass(frozen=True, slots=True)
class Aside:
    """The rows :func:`set_aside` keeps out of ``blocks``."""

    #: entry ids of the set-aside rows (the bad ones and those above them)
    entry_ids: pa.Array = field(default_factory=lambda: _EMPTY_IDS)
    #: ``(hash, num, parent's height)`` of every bad one, lowest first
    bad: tuple[tuple[str, int, int], ...] = ()


@dataclass(slots=True)
class Heights:
    """What one archive run set aside, summed over its writers' calls."""

    #: blocks with a bad height
    bad: int = 0
    #: those and the blocks above them
    aside: int = 0
    #: ``(hash, num, parent's height)`` of the first :data:`NAMED` bad ones
    named: list[tuple[str, int, int]] = field(default_factory=list)

    def add(self, aside: Aside) -> None:
        self.bad += len(aside.bad)
        self.aside += len(aside.entry_ids)
        self.named.extend(aside.bad[: NAMED - len(self.named)])


def set_aside(
    lake: LakeSettings, stream: str, rows: pa.Table, context: pa.Table | None = None
) -> Aside:
    """Which of ``rows`` (the batch's new ``blocks`` rows: ``entry_id``, ``num``, ``hash``,
    ``parent``; one per hash) stay out of ``blocks``. ``context``: ``hash`` and ``num`` of
    other blocks of the batch, parents to find but not rows to judge."""
    if not rows.num_rows:
        return Aside()
    rows = rows.select(ROWS.names).cast(ROWS)
    hashes, nums = rows.column("hash"), rows.column("num")
    if context is not None and context.num_rows:
        hashes = pa.chunked_array(
            [*hashes.chunks, *context.column("hash").cast(pa.string()).chunks]
        )
        nums = pa.chunked_array([*nums.chunks, *context.column("num").cast(pa.int64()).chunks])
    at = pc.index_in(rows.column("parent"), value_set=hashes.combine_chunks())
    in_batch = pc.take(nums.combine_chunks(), at)  # null where the parent is not in the batch
    below = pc.subtract(rows.column("num").combine_chunks(), 1)
    bad = pc.fill_null(pc.not_equal(in_batch, below), False)
    loose = rows.filter(pc.is_null(at))
    heights, earlier = _in_lake(lake, stream, loose)
    lying = any(
        heights.get(parent, num - 1) != num - 1
        for parent, num in zip(
            loose.column("parent").to_pylist(), loose.column("num").to_pylist(), strict=True
        )
    )
    if not lying and not earlier and not pc.any(bad).as_py():
        return Aside()  # the common batch: every known parent one height down
    return _judge(rows, in_batch.to_pylist(), heights, earlier)


def _judge(
    rows: pa.Table,
    in_batch: list[int | None],
    heights: dict[str, int],
    earlier: dict[str, int],
) -> Aside:
    """The rows set aside, lowest first, once a parent's height is known where it can be."""
    ids, nums = rows.column("entry_id").to_pylist(), rows.column("num").to_pylist()
    hashes, parents = rows.column("hash").to_pylist(), rows.column("parent").to_pylist()
    out: set[str] = set(earlier)  # parents set aside by an earlier run
    kept: list[str] = []
    bad: list[tuple[str, int, int]] = []
    # Lowest first: an honest link goes from num - 1 to num, so a parent is settled first.
    for i in sorted(range(len(ids)), key=nums.__getitem__):
        parent = parents[i]
        height = in_batch[i]
        if height is None:
            height = heights.get(parent, earlier.get(parent))
        if height is not None and height != nums[i] - 1:
            bad.append((hashes[i], nums[i], height))
        elif parent not in out:
            continue
        out.add(hashes[i])
        kept.append(ids[i])
    return Aside(pa.array(kept, pa.string()), tuple(bad))


def _in_lake(
    lake: LakeSettings, stream: str, loose: pa.Table
) -> tuple[dict[str, int], dict[str, int]]:
    """``(heights, earlier)`` of the parents of ``loose`` (rows whose parent is not in the
    batch): their heights in ``blocks``, and those an earlier run set aside (steps 2, 3)."""
    if not loose.num_rows or not store.is_table(lake, tables.BLOCKS):
        return {}, {}
    wanted = set(loose.column("parent").to_pylist())
    honest = sorted(set(pc.subtract(loose.column("num"), 1).to_pylist()) - {-1})
    heights = _pruned(lake, tables.BLOCKS, stream, "num", "hash", honest, wanted)
    missing = wanted - set(heights)
    earlier: dict[str, int] = {}
    if missing and store.is_table(lake, tables.STREAM_ENTRIES):
        earlier = _pruned(
            lake, tables.STREAM_ENTRIES, stream, "block_num", "block_hash", honest, missing
        )
        missing -= set(earlier)
    if missing:
        heights.update(
            (h, n) for h, n in parent_heights(lake, stream, missing).items() if n is not None
        )
    return heights, earlier


def _pruned(
    lake: LakeSettings,
    name: str,
    stream: str,
    num: str,
    digest: str,
    at: list[int],
    wanted: set[str],
) -> dict[str, int]:
    """``{hash: height}`` of the rows of table ``name`` with a hash of ``wanted`` at one of
    the heights ``at`` (sorted), read in at most :data:`MAX_READS` spans of files pruned by
    ``num`` (a ``stream_entries`` row counts only as a valid block)."""
    found: dict[str, int] = {}
    for lo, hi in _spans(at)[:MAX_READS]:
        columns = [digest, num] + (["valid_block"] if name == tables.STREAM_ENTRIES else [])
        table = interval_scan(lake, name, stream, num, lo, hi, columns)
        keep = pc.is_in(table.column(digest), value_set=pa.array(sorted(wanted), pa.string()))
        if name == tables.STREAM_ENTRIES:
            keep = pc.and_(keep, pc.fill_null(table.column("valid_block"), False))
        table = table.filter(keep)
        found.update(
            zip(table.column(digest).to_pylist(), table.column(num).to_pylist(), strict=True)
        )
    return found


def _spans(at: list[int]) -> list[tuple[int, int]]:
    """Sorted heights as inclusive ranges, cut where two are more than :data:`SPAN` apart."""
    spans: list[tuple[int, int]] = []
    for height in at:
        if spans and height - spans[-1][1] <= SPAN and height - spans[-1][0] <= SPAN:
            spans[-1] = (spans[-1][0], height)
        else:
            spans.append((height, height))
    return spans


__all__ = ["NAMED", "ROWS", "Aside", "Heights", "set_aside"]
