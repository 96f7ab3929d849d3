"""Mark the canonical chain of a stream in ``blocks``.

Theory of operation: the head is the heaviest block, the one with the
greatest weight (``blocks.weight``; a row without one weighs ``num + 1``), and
ties go to the block seen first (archived from the earliest stream entry), so
a reorg to a shorter but heavier chain is followed. From the head the walk
follows parent links down, marking each block canonical and unmarking any
other block canonical at the same height, until it reaches a block that is
already canonical (the join with the chain marked before), a parent that is
not in the table (a gap, or the genesis), or height 0. Reorged blocks stay
in the table with ``canonical = false``.

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
    seen: set[str] = set()
    current = head
    while not current.canonical and current.hash not in seen:
        seen.add(current.hash)
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
    top = _max_num(lake, stream)
    if top is None:
        return CanonicalResult(stream=stream, head_num=None, head_hash=None, marked=0, unmarked=0)
    window = WINDOW
    while True:
        floor = max(0, top - window)
        plan = plan_walk(_nodes(lake, stream, floor), floor)
        if not plan.needs_lower or floor == 0:
            break
        window *= 4
    head = plan.head
    assert head is not None
    if plan.mark or plan.unmark:
        run_spark(f"canonical marking of {stream!r}", lambda: _apply(spark, lake, stream, plan))
    return CanonicalResult(
        stream=stream,
        head_num=head.num,
        head_hash=bytes.fromhex(head.hash),
        marked=len(plan.mark),
        unmarked=len(plan.unmark),
    )


def _dataset(lake: LakeSettings, stream: str, floor: int) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(lake.table(tables.BLOCKS)).to_pyarrow_dataset(
        file_pruning_predicate=[("stream", "=", stream), ("num", ">=", floor)]
    )


def _max_num(lake: LakeSettings, stream: str) -> int | None:
    import pyarrow.compute as pc

    nums = (
        _dataset(lake, stream, 0)
        .to_table(columns=["num"], filter=pc.field("stream") == stream)
        .column("num")
    )
    return None if len(nums) == 0 else int(pc.max(nums).as_py())


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
