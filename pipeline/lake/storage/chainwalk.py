"""The canonical walk of a chain stream: pure planning and its delta-rs reads (no Spark).

:func:`plan_walk` plans which blocks become canonical (and which stop being)
from rows of the ``blocks`` table; :func:`pending` reads those rows with
delta-rs and plans, so the canonical job (:mod:`pipeline.lake.canonical`, which
applies the plan with Spark) and trim (which keeps every block still to be
marked) share one walk. The rules are in :mod:`pipeline.lake.canonical`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipeline.blockcodec import effective_weight
from pipeline.lake.storage import store, tables
from pipeline.settings import LakeSettings

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


def pending(lake: LakeSettings, stream: str) -> Plan:
    """The canonical job's plan for ``stream`` as the lake stands (read with delta-rs, no writes).

    The window starts :data:`WINDOW` heights under the top, reaches down to
    the lowest unmarked height, and widens while the walk runs off its bottom.
    An empty plan (``head`` None) when the stream has no block.
    """
    if not store.is_table(lake, tables.BLOCKS):
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
    return store.open_table(lake, tables.BLOCKS).to_pyarrow_dataset(
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
