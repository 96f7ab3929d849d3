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

Heights that lie: a block whose height is not its parent's plus one (the
parent in the walk's window, or looked up by hash when the window misses
it where an honest height would put it:
:func:`~pipeline.lake.storage.chainwalk.parent_heights`) is set aside with
every block above it: none of them heads the chain, the walk never crosses
such a link, and one an older run marked is unmarked. The result counts them
(``bad_height``, the first hashes in ``bad_height_hashes``, ``set_aside`` with
their descendants) and the job logs them once. A cycle of parent links
always holds such a link, so it is set aside too.

Only a chain stream is marked: a stream ``SLUICE_CHAIN_STREAMS`` does not
name, or a named one whose first and last entries in Redis are not blocks,
is refused before anything is written
(:func:`~pipeline.lake.intake.streamset.check_now`).

:func:`~pipeline.lake.storage.chainwalk.pending` is the same read and walk without
writing (no Spark): trim uses it to keep in Redis every block the canonical
job still has to mark.

The walk itself is the pure :func:`~pipeline.lake.storage.chainwalk.plan_walk`; the job reads a window of
``(num, hash, parent, canonical, entry_id, weight)`` rows with delta-rs (no payloads,
files pruned by ``num``), widening the window downwards while the walk runs
off its bottom, then applies the changes as one delta-rs commit: the ``blocks``
files of the changed ``num`` range are rewritten with pyarrow
(:mod:`pipeline.lake.write.rewrite`), on a local lake as on object storage. No Spark:
a Spark MERGE of the same change cost about 5.6 s per run through a warm Connect
server (25 s on its first MERGE); ``canonical_s`` of ``make bench B=archive``
measures this one. A second run finds the head canonical and changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pipeline.blockcodec.streamkind import not_chain
from pipeline.errors import StreamKindError
from pipeline.lake.intake.streamset import check_now
from pipeline.lake.storage import tables
from pipeline.lake.storage.chainwalk import Node, Plan, pending, plan_walk
from pipeline.lake.write.jobs import delta_retry, ensure_tables
from pipeline.settings import LakeSettings, Settings

log = logging.getLogger(__name__)

#: Hashes of set-aside blocks a result and its log line name (the count is exact).
NAMED = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class CanonicalResult:
    stream: str
    head_num: int | None
    head_hash: bytes | None
    marked: int
    unmarked: int
    #: blocks of the walk's window whose height is not their parent's plus one
    bad_height: int = 0
    #: the first :data:`NAMED` of them (hex), lowest first
    bad_height_hashes: tuple[str, ...] = ()
    #: those and the blocks above them: never canonical
    set_aside: int = 0


def mark_canonical(spark: Any, settings: Settings, stream: str) -> CanonicalResult:
    """Mark the canonical chain of ``stream`` from its head down; idempotent.

    Raises :class:`StreamKindError` for a stream that is not a chain stream
    (``SLUICE_CHAIN_STREAMS``, checked against its entries in Redis) before any write.
    """
    lake = settings.lake
    refusal = not_chain(lake.chain_streams, stream, "canonical marking is for chain streams only")
    if refusal is not None:
        raise StreamKindError(refusal)
    check_now(settings, stream)
    ensure_tables(lake)
    plan = pending(lake, stream)
    head = plan.head
    named = tuple(n.hash for n in plan.bad[:NAMED])
    if plan.bad:
        first = plan.bad[0]
        log.warning(
            "stream %s: %d block(s) set aside, never canonical: height not the parent's plus "
            "one (first: %s at %d); %d with the blocks above them",
            stream, len(plan.bad), first.hash, first.num, plan.aside,
        )  # fmt: skip
    if plan.mark or plan.unmark:
        delta_retry(f"canonical marking of {stream!r}", lambda: _apply_delta(lake, stream, plan))
    return CanonicalResult(
        stream=stream,
        head_num=None if head is None else head.num,
        head_hash=None if head is None else bytes.fromhex(head.hash),
        marked=len(plan.mark),
        unmarked=len(plan.unmark),
        bad_height=len(plan.bad),
        bad_height_hashes=named,
        set_aside=plan.aside,
    )


def _changes(plan: Plan) -> Any:
    """The plan as an arrow table of (num, hash, canonical)."""
    import pyarrow as pa

    changes = [(n.num, n.hash, True) for n in plan.mark] + [
        (n.num, n.hash, False) for n in plan.unmark
    ]
    return pa.table(
        {
            "num": pa.array([c[0] for c in changes], pa.int64()),
            "hash": pa.array([c[1] for c in changes], pa.string()),
            "canonical": pa.array([c[2] for c in changes], pa.bool_()),
        }
    )


def _apply_delta(lake: LakeSettings, stream: str, plan: Plan) -> None:
    """The plan's changes with pyarrow and delta-rs (:mod:`pipeline.lake.write.rewrite`): one commit."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.lake.write.rewrite import rewrite_partition_range

    frame = _changes(plan)
    wanted = {
        (n, h): c
        for n, h, c in zip(
            frame.column("num").to_pylist(),
            frame.column("hash").to_pylist(),
            frame.column("canonical").to_pylist(),
            strict=True,
        )
    }

    def change(rows: pa.Table) -> pa.Table | None:
        old = rows.column("canonical").to_pylist()
        new = [
            wanted.get((n, h), c)
            for n, h, c in zip(
                rows.column("num").to_pylist(), rows.column("hash").to_pylist(), old, strict=True
            )
        ]
        if new == old:
            return None
        index = rows.schema.get_field_index("canonical")
        return rows.set_column(index, rows.schema.field(index), pa.array(new, pa.bool_()))

    lo, hi = pc.min(frame.column("num")).as_py(), pc.max(frame.column("num")).as_py()
    rewrite_partition_range(lake, tables.BLOCKS, stream, "num", lo, hi, change)


__all__ = ["CanonicalResult", "Node", "Plan", "mark_canonical", "pending", "plan_walk"]
