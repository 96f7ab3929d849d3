"""Where the lake's canonical flags lag the Redis tail: the blocks between them, from the lake.

The lake's ``canonical`` flags are set by the canonical job, after the archive.
Below the Redis tail, resumption otherwise trusts them. They can lag: two
branches of equal weight were archived, the job marked the one seen first,
trim took both out of Redis, and then a child of the other one (still in Redis,
the tail's first block) made that other branch the heaviest. Until the job
runs again, the tail's first block does not link to the lake's canonical block
below it (history checker seed 1028: a resume matched the lake's stale flag,
the tail did not link to what was sent, and the subscriber went quiet).

:func:`seam_of` finds that branch: the tail's first block's ancestors, walked
down through the lake by hash while the lake does not mark them canonical.
:func:`walk_branch` is the walk, also used by replay for an entry whose parent
the lake holds but does not mark. Both block (lake reads): run them in a thread.
"""

from __future__ import annotations

from pipeline.chain.planning import History, Seam
from pipeline.chain.tailindex import TailIndex

#: Lake lookups a walk down a branch makes before it gives up.
LAKE_WALK = 1024

Row = tuple[int, str, str, bytes]


def walk_branch(history: History, stream: str, hash: str, num: int) -> list[Row] | None:
    """The block ``hash`` at ``num`` and its ancestors the lake holds but does not mark
    canonical, lowest first, down to a canonical one (not included).

    ``[]`` when ``hash`` itself is canonical; None when the walk meets a block the lake
    does not hold, a height that is not its parent's plus one, or runs past :data:`LAKE_WALK`.
    """
    rows: list[Row] = []
    while len(rows) <= LAKE_WALK:
        row = history.find_hash(stream, bytes.fromhex(hash))
        if row is None or row.num != num:
            return None
        if row.canonical:
            break
        parent = bytes(row.parent).hex()
        rows.append((num, hash, parent, bytes(row.payload)))
        if num == 0:
            break
        hash, num = parent, num - 1
    else:
        return None
    rows.reverse()
    return rows


def seam_of(history: History, stream: str, tail: TailIndex) -> Seam | None:
    """The canonical blocks right below ``tail`` that the lake does not mark, or None
    when the lake's canonical block below the tail is the tail's first block's parent
    (one lake read, pruned by height: the common case) or the walk finds no branch."""
    lo = tail.lo
    if lo is None or lo == 0:
        return None
    parent = tail.chain[lo][1]
    below = history.canonical_at(stream, lo - 1)
    if below is not None and bytes(below.hash).hex() == parent:
        return None
    rows = walk_branch(history, stream, parent, lo - 1)
    return Seam(tuple(rows)) if rows else None


__all__ = ["LAKE_WALK", "seam_of", "walk_branch"]
