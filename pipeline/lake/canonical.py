"""Mark the canonical chain of a stream in ``blocks``.

Theory of operation: the head is the heaviest block, the one with the
greatest weight (``blocks.weight``; a row without one weighs ``num + 1``), and
ties go to the block seen first (archived from the earliest stream entry), so
a reorg to a shorter but heavier chain is followed. From the head the walk
follows parent links down, marking each block canonical and unmarking any
other block canonical at the same height, until it reaches a block that is
already canonical (the join with the chain marked before) with no unmarked
height below it, a parent that is not in the table (a gap, or the genesis),
or height 0. An unmarked height is one below the highest canonical block
where no block is canonical: blocks archived under the marked chain later
(a backfill, or a run catching up on intervals an earlier run skipped). The
walk goes on down through canonical blocks to the lowest of those, so they
are marked too. Reorged blocks stay in the table with ``canonical = false``.

:func:`pending` is the same read and walk without writing: trim uses it to
keep in Redis every block the canonical job still has to mark.

The walk itself is the pure :func:`plan_walk`; the job reads a window of
``(num, hash, parent, canonical, entry_id, weight)`` rows with delta-rs (no payloads,
files pruned by ``num``), widening the window downwards while the walk runs
off its bottom, then applies the changes with one Spark MERGE. A second run
finds the head canonical and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipeline.chain.batch import effective_weight
from pipeline.lake import tables
from pipeline.lake.jobs import ensure_tables, run_spark, table_sql
from pipeline.settings import LakeSettings, Settings

#: First window of block heights read below the head; doubled while needed.
WINDOW = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    num: int
    hash: str
    parent: str
    canonical: bool
    #: (entry ms, entry seq) of the entry the block was archived from: breaks head ties.
    order: tuple[int, int] = (0, 0)
    #: the stored weight; None for rows written before weights (they weigh ``num + 1``)
    weight: int | None = None

    @property
    def effective_weight(self) -> int:
        return effective_weight(self.num, self.weight)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    head: Node | None
    mark: tuple[Node, ...]
    unmark: tuple[Node, ...]
    #: the walk ran off the bottom of the window: read lower heights and plan again
    needs_lower: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CanonicalResult:
    stream: str
    head_num: int | None
    head_hash: bytes | None
    marked: int
    unmarked: int


def plan_walk(nodes: Iterable[Node], floor: int) -> Plan:
    """Plan canonical changes from the rows of heights ``>= floor`` (pure)."""
    by_hash: dict[str, Node] = {}
    canonical_at: dict[int, list[Node]] = {}
    head: Node | None = None
    for node in nodes:
        by_hash[node.hash] = node
        if node.canonical:
            canonical_at.setdefault(node.num, []).append(node)
        if head is None or _heavier(node, head):
            head = node
    if head is None:
        return Plan(head=None, mark=(), unmark=(), needs_lower=False)
    mark: list[Node] = []
    # A head below canonical heights (a shorter, heavier chain): those leave the chain.
    unmark: list[Node] = [n for num, ns in canonical_at.items() if num > head.num for n in ns]
    # Heights under the head where nothing is canonical yet: filled in below the marked chain.
    unmarked = [node.num for node in by_hash.values() if node.num not in canonical_at]
    lowest_unmarked = min((num for num in unmarked if num < head.num), default=None)
    seen: set[str] = set()
    current = head
    while current.hash not in seen:
        if current.canonical and (lowest_unmarked is None or lowest_unmarked > current.num):
            break  # joined the marked chain, and nothing below is left unmarked
        seen.add(current.hash)
        if not current.canonical:
            mark.append(current)
        unmark.extend(n for n in canonical_at.get(current.num, ()) if n.hash != current.hash)
        parent = by_hash.get(current.parent)
        if parent is None:
            below_window = current.num > 0 and current.num <= floor and floor > 0
            return Plan(head=head, mark=tuple(mark), unmark=tuple(unmark), needs_lower=below_window)
        current = parent
    return Plan(head=head, mark=tuple(mark), unmark=tuple(unmark), needs_lower=False)


def _heavier(node: Node, head: Node) -> bool:
    """Fork choice: greater weight wins; equal weight goes to the block seen first."""
    weight, best = node.effective_weight, head.effective_weight
    return weight > best or (weight == best and node.order < head.order)


def mark_canonical(spark: Any, settings: Settings, stream: str) -> CanonicalResult:
    """Mark the canonical chain of ``stream`` from its head down; idempotent."""
    lake = settings.lake
    ensure_tables(lake)
    plan = pending(lake, stream)
    head = plan.head
    if head is None:
        return CanonicalResult(stream=stream, head_num=None, head_hash=None, marked=0, unmarked=0)
    if plan.mark or plan.unmark:
        run_spark(f"canonical marking of {stream!r}", lambda: _apply(spark, lake, stream, plan))
    return CanonicalResult(
        stream=stream,
        head_num=head.num,
        head_hash=bytes.fromhex(head.hash),
        marked=len(plan.mark),
        unmarked=len(plan.unmark),
    )


def pending(lake: LakeSettings, stream: str) -> Plan:
    """The canonical job's plan for ``stream`` as the lake stands (read with delta-rs, no writes).

    The window starts :data:`WINDOW` heights under the top, reaches down to
    the lowest unmarked height, and widens while the walk runs off its bottom.
    An empty plan (``head`` None) when the stream has no block.
    """
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(lake.table(tables.BLOCKS)):
        return Plan(head=None, mark=(), unmark=(), needs_lower=False)
    top, lowest_unmarked = _heights(lake, stream)
    if top is None:
        return Plan(head=None, mark=(), unmark=(), needs_lower=False)
    window = WINDOW
    while True:
        floor = max(0, top - window)
        if lowest_unmarked is not None:
            floor = min(floor, lowest_unmarked)
        plan = plan_walk(_nodes(lake, stream, floor), floor)
        if not plan.needs_lower or floor == 0:
            return plan
        window *= 4


def _dataset(lake: LakeSettings, stream: str, floor: int) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(lake.table(tables.BLOCKS)).to_pyarrow_dataset(
        file_pruning_predicate=[("stream", "=", stream), ("num", ">=", floor)]
    )


def _heights(lake: LakeSettings, stream: str) -> tuple[int | None, int | None]:
    """(top height, lowest height under the highest canonical block with no canonical block).

    Reads two narrow columns of the stream's rows (no hashes, no payloads).
    """
    import pyarrow.compute as pc

    table = _dataset(lake, stream, 0).to_table(
        columns=["num", "canonical"], filter=pc.field("stream") == stream
    )
    if table.num_rows == 0:
        return None, None
    top = int(pc.max(table.column("num")).as_py())
    per_height = table.group_by("num").aggregate([("canonical", "any")])
    marked = per_height.filter(pc.field("canonical_any"))
    if marked.num_rows == 0:
        return top, None
    highest_marked = pc.max(marked.column("num")).as_py()
    holes = per_height.filter(
        pc.invert(pc.field("canonical_any")) & (pc.field("num") < highest_marked)
    )
    lowest = pc.min(holes.column("num")).as_py() if holes.num_rows else None
    return top, None if lowest is None else int(lowest)


def _nodes(lake: LakeSettings, stream: str, floor: int) -> list[Node]:
    import pyarrow.compute as pc

    dataset = _dataset(lake, stream, floor)
    columns = ["num", "hash", "parent", "canonical", "entry_id"]
    has_weight = tables.WEIGHT_COLUMN in dataset.schema.names  # absent in pre-weight tables
    table = dataset.to_table(
        columns=[*columns, tables.WEIGHT_COLUMN] if has_weight else columns,
        filter=(pc.field("stream") == stream) & (pc.field("num") >= floor),
    )
    weights = (
        table.column(tables.WEIGHT_COLUMN).to_pylist() if has_weight else [None] * table.num_rows
    )
    return [
        Node(
            num=n,
            hash=h,
            parent=p,
            canonical=bool(c),
            order=_order(e),
            weight=None if w is None else int.from_bytes(w, "big"),
        )
        for n, h, p, c, e, w in zip(
            table.column("num").to_pylist(),
            table.column("hash").to_pylist(),
            table.column("parent").to_pylist(),
            table.column("canonical").to_pylist(),
            table.column("entry_id").to_pylist(),
            weights,
            strict=True,
        )
    ]


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)


def _apply(spark: Any, lake: LakeSettings, stream: str, plan: Plan) -> None:
    import pyarrow as pa

    changes = [(n.num, n.hash, True) for n in plan.mark] + [
        (n.num, n.hash, False) for n in plan.unmark
    ]
    frame = pa.table(
        {
            "num": pa.array([c[0] for c in changes], pa.int64()),
            "hash": pa.array([c[1] for c in changes], pa.string()),
            "canonical": pa.array([c[2] for c in changes], pa.bool_()),
        }
    )
    source = spark.createDataFrame(frame)
    source.createOrReplaceTempView("sluice_canonical_changes")
    lo = min(c[0] for c in changes)
    hi = max(c[0] for c in changes)
    stream_sql = stream.replace("\\", "\\\\").replace("'", "\\'")
    spark.sql(
        f"MERGE INTO {table_sql(lake, tables.BLOCKS)} t USING sluice_canonical_changes s "
        f"ON t.stream = '{stream_sql}' AND t.num >= {lo} AND t.num <= {hi} "
        "AND t.num = s.num AND t.hash = s.hash "
        "WHEN MATCHED AND t.canonical <> s.canonical THEN UPDATE SET canonical = s.canonical"
    )
