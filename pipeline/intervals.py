"""Half-open ``[start, end)`` millisecond intervals: merging and coverage (pure).

Used by the lake's safe trim and backfill, and by the chain's coverage view,
so neither imports the other (nor pyarrow) for it.
"""

from __future__ import annotations

from collections.abc import Iterable


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` intervals merged into sorted disjoint runs (adjacent ones join)."""
    runs: list[tuple[int, int]] = []
    for start, end in sorted(i for i in intervals if i[0] < i[1]):
        if runs and start <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(runs[-1][1], end))
        else:
            runs.append((start, end))
    return runs


def covered_until(intervals: Iterable[tuple[int, int]], oldest_ms: int) -> int | None:
    """End of the coverage run that contains ``oldest_ms``, or None if none does."""
    for start, end in merge_intervals(intervals):
        if start <= oldest_ms < end:
            return end
    return None
