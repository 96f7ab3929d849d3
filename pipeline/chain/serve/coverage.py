"""The lake's coverage of a stream next to its Redis hot window: pure functions.

Shared by the status page of ``sluice serve`` (:mod:`pipeline.chain.serve.status`)
and the Airflow coverage view (``plugins/sluice_coverage.py``), so both show
the same runs, gaps and trim point. No I/O, no asyncio, no aiohttp: callers
read ``archive_log`` and ``XINFO STREAM`` themselves and pass the numbers in.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.intervals import merge_intervals

#: Archived runs (and gaps) reported per stream: the newest ones.
MAX_RUNS = 64

_MAX_MS = 1 << 63


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """One ``archive_log`` row: ``[start_ms, end_ms)`` of a stream was archived."""

    start_ms: int
    end_ms: int
    entries: int
    blocks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Archived:
    """What ``archive_log`` says of one stream: its intervals merged into runs, and totals."""

    intervals: int = 0
    entries: int = 0
    blocks: int = 0
    #: Disjoint ``[start_ms, end_ms)`` runs, oldest first (adjacent intervals joined).
    runs: tuple[tuple[int, int], ...] = ()


def summarize(intervals: Sequence[Interval]) -> Archived:
    """Merge a stream's logged intervals exactly as the safe trim does."""
    return Archived(
        intervals=len(intervals),
        entries=sum(i.entries for i in intervals),
        blocks=sum(i.blocks for i in intervals),
        runs=tuple(merge_intervals((i.start_ms, i.end_ms) for i in intervals)),
    )


def coverage(
    archived: Archived,
    *,
    first_ms: int | None,
    last_ms: int | None,
    now_ms: int,
    hot_retention_s: int,
) -> dict[str, Any]:
    """The lake's coverage of one stream next to its Redis hot window, as the page shows it.

    ``runs`` are the merged archived intervals (newest :data:`MAX_RUNS`),
    ``gaps`` the holes between consecutive runs, ``trim_point_ms`` the oldest
    entry still in Redis (everything older was trimmed), and
    ``trimmable_to_ms`` how far the next safe trim would cut (None: not at
    all, because the oldest entry is not in an archived run).
    """
    runs = list(archived.runs)
    tail = runs[-(MAX_RUNS + 1) :]
    gaps = [(a[1], b[0]) for a, b in zip(tail, tail[1:], strict=False)]
    trimmable: int | None = None
    if first_ms is not None:
        # the run holding the oldest entry (runs are disjoint and sorted: a binary search)
        at = bisect.bisect_right(runs, (first_ms, _MAX_MS)) - 1
        if at >= 0 and runs[at][0] <= first_ms < runs[at][1]:
            trimmable = max(first_ms, min(runs[at][1], now_ms - hot_retention_s * 1000))
    return {
        "intervals": archived.intervals,
        "entries": archived.entries,
        "blocks": archived.blocks,
        "runs": [list(r) for r in runs[-MAX_RUNS:]],
        "run_count": len(runs),
        "gaps": [list(g) for g in gaps[-MAX_RUNS:]],
        "gap_count": max(0, len(runs) - 1),
        "archived_from_ms": runs[0][0] if runs else None,
        "archived_to_ms": runs[-1][1] if runs else None,
        "trim_point_ms": first_ms,
        "trimmable_to_ms": trimmable,
        "unarchived_from_ms": _unarchived_from(runs, first_ms, last_ms),
    }


def _unarchived_from(
    runs: list[tuple[int, int]], first_ms: int | None, last_ms: int | None
) -> int | None:
    """Where the Redis entries no archive run covers start (None: Redis is empty or all archived)."""
    if first_ms is None or last_ms is None:
        return None
    if not runs:
        return first_ms
    end = runs[-1][1]
    return max(end, first_ms) if last_ms >= end else None


__all__ = ["MAX_RUNS", "Archived", "Interval", "coverage", "summarize"]
