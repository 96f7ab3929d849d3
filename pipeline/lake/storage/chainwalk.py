"""The canonical walk of a chain stream: pure planning and its delta-rs reads (no Spark).

:func:`plan_walk` plans which blocks become canonical (and which stop being)
from rows of the ``blocks`` table; :func:`pending` reads those rows with
delta-rs and plans, so the canonical job (:mod:`pipeline.lake.canonical`, which
applies the plan with Spark) and trim (which keeps every block still to be
marked) share one walk. The rules are in :mod:`pipeline.lake.canonical`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
    #: blocks whose height is not their parent's plus one (the parent in the window or
    #: looked up): out of the fork choice, never canonical
    bad: tuple[Node, ...] = ()
    #: blocks out of the fork choice: ``bad`` and every block of the window above one
    aside: int = 0
    #: parents to look up (:func:`parent_heights`) before the plan holds: the walk met a
    #: block whose parent should be in the window and is not (a gap, or a height that lies)
    unresolved: tuple[str, ...] = ()


def plan_walk(
    nodes: Iterable[Node], floor: int, known: Mapping[str, int | None] | None = None
) -> Plan:
    """Plan canonical changes from the rows of heights ``>= floor`` (pure).

    ``known``: heights of parents outside the window, looked up by hash (None: not
    in the lake). A block whose parent's height (in the window or ``known``) is not
    its own minus one is set aside with every block above it: no head among them,
    and the walk never crosses such a link (:func:`set_aside`).
    """
    rows = list(nodes)
    by_hash: dict[str, Node] = {}
    canonical_at: dict[int, list[Node]] = {}
    for node in rows:
        by_hash[node.hash] = node
        if node.canonical:
            canonical_at.setdefault(node.num, []).append(node)
    bad, aside = set_aside(by_hash, known or {})
    head: Node | None = None
    for node in rows:
        if node.hash not in aside and (head is None or _heavier(node, head)):
            head = node
    # Set-aside blocks marked by an older run leave the chain.
    out = [n for n in by_hash.values() if n.hash in aside and n.canonical]
    if head is None:  # blocks, but none to head the chain here: look lower
        return Plan(head=None, mark=(), unmark=tuple(out), needs_lower=bool(rows) and floor > 0,
                    bad=bad, aside=len(aside))  # fmt: skip
    walk = _walk(head, by_hash, canonical_at, aside, floor, known or {})
    unmark = [*walk.unmark, *(n for n in out if n not in walk.unmark)]
    unresolved = _missing(by_hash, floor, known or {}) if walk.unresolved else ()
    return Plan(head=head, mark=walk.mark, unmark=tuple(unmark), needs_lower=walk.needs_lower,
                bad=bad, aside=len(aside), unresolved=unresolved)  # fmt: skip


def set_aside(by_hash: Mapping[str, Node], known: Mapping[str, int | None]) -> tuple[
    tuple[Node, ...], set[str]
]:  # fmt: skip
    """``(bad, aside)``: the blocks whose height is not their parent's plus one, and the
    hashes of those and of every block that descends from one (in the window)."""
    bad: list[Node] = []
    aside: set[str] = set()
    # Lowest first: an honest link goes from num - 1 to num, so a parent is settled first.
    for node in sorted(by_hash.values(), key=lambda n: n.num):
        parent = by_hash.get(node.parent)
        height = parent.num if parent is not None else known.get(node.parent)
        if height is not None and height != node.num - 1:
            bad.append(node)
            aside.add(node.hash)
        elif parent is not None and parent.hash in aside:
            aside.add(node.hash)
    return tuple(bad), aside


@dataclass(frozen=True, slots=True)
class _Walk:
    mark: tuple[Node, ...]
    unmark: tuple[Node, ...]
    needs_lower: bool
    unresolved: bool = False


def _walk(
    head: Node,
    by_hash: Mapping[str, Node],
    canonical_at: Mapping[int, list[Node]],
    aside: set[str],
    floor: int,
    known: Mapping[str, int | None],
) -> _Walk:
    """Walk parent links down from ``head``, marking and unmarking (the module's rules)."""
    mark: list[Node] = []
    # A head below canonical heights (a shorter, heavier chain): those leave the chain.
    unmark: list[Node] = [n for num, ns in canonical_at.items() if num > head.num for n in ns]
    # Heights under the head where nothing is canonical yet: filled in below the marked chain.
    unmarked = [
        n.num for n in by_hash.values() if n.num not in canonical_at and n.hash not in aside
    ]
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
            if _should_be_here(current, floor) and current.parent not in known:
                return _Walk(tuple(mark), tuple(unmark), False, unresolved=True)
            below_window = current.num > 0 and current.num <= floor and floor > 0
            return _Walk(tuple(mark), tuple(unmark), below_window)
        current = parent
    return _Walk(tuple(mark), tuple(unmark), False)


def _should_be_here(node: Node, floor: int) -> bool:
    """True when an honest parent of ``node`` would be in a window starting at ``floor > 0``."""
    return floor > 0 and node.num - 1 >= floor


def _missing(
    by_hash: Mapping[str, Node], floor: int, known: Mapping[str, int | None]
) -> tuple[str, ...]:
    """Parents an honest window would hold that it does not and that are not looked up."""
    return tuple(
        sorted(
            {
                n.parent
                for n in by_hash.values()
                if n.parent not in by_hash and n.parent not in known and _should_be_here(n, floor)
            }
        )
    )


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
    known: dict[str, int | None] = {}
    while True:
        floor = max(0, top - window)
        if lowest_unmarked is not None:
            floor = min(floor, lowest_unmarked)
        nodes = _nodes(lake, stream, floor)
        plan = plan_walk(nodes, floor, known)
        if plan.unresolved:  # once per window: every parent the window misses, in one read
            known.update(parent_heights(lake, stream, plan.unresolved))
            plan = plan_walk(nodes, floor, known)
        if not plan.needs_lower or floor == 0:
            return plan
        window *= 4


def parent_heights(lake: LakeSettings, stream: str, hashes: Iterable[str]) -> dict[str, int | None]:
    """The height of each block of ``hashes`` in ``blocks`` (None: not there).

    Reads the ``hash`` and ``num`` columns of every file of the stream (a hash
    says nothing about where its row is): what a walk or an archive pays only
    when a parent is missing where an honest height would put it.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = sorted(set(hashes))
    found: dict[str, int | None] = dict.fromkeys(wanted)
    if not wanted or not store.is_table(lake, tables.BLOCKS):
        return found
    # Filtered here, not by the dataset: in a table without ``dataSkippingStatsColumns``
    # delta-rs gives each file a guarantee on ``hash`` (no statistics) that drops it.
    table = _dataset(lake, stream, 0).to_table(
        columns=["hash", "num"], filter=pc.field("stream") == stream
    )
    table = table.filter(pc.is_in(table.column("hash"), value_set=pa.array(wanted, pa.string())))
    for digest, num in zip(
        table.column("hash").to_pylist(), table.column("num").to_pylist(), strict=True
    ):
        seen = found[digest]
        found[digest] = num if seen is None else min(seen, num)
    return found


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
