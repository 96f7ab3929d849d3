"""Which intervals one archive run archives: the holes ``archive_log`` shows, then its own.

Pure (no Airflow, no Spark, no I/O): the archive DAG's jobs and their tests
share it. See :func:`archive_steps`.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Most earlier intervals one archive run catches up per stream, oldest first, besides its own.
CATCHUP_MAX_STEPS = 12
#: What a result keeps of each catch-up step (``caught_up``).
CAUGHT_UP_FIELDS = ("start_ms", "end_ms", "read", "entries", "blocks", "invalid", "warnings")


def archive_steps(
    logged: Iterable[tuple[int, int]],
    start_ms: int,
    end_ms: int,
    *,
    max_steps: int = CATCHUP_MAX_STEPS,
) -> list[tuple[int, int]]:
    """The intervals one archive task archives: earlier holes, oldest first, then its own.

    ``logged`` are the stream's ``archive_log`` intervals. A hole is any part
    of ``[first logged start, start_ms)`` no row covers (an interval the
    scheduler skipped because a run overran, or whose run failed); holes are
    cut on the grid of this run's interval (``end_ms - start_ms`` wide,
    anchored at ``start_ms``), so the rows look like the scheduler's. At most
    ``max_steps`` hole pieces are returned (the oldest: coverage grows
    contiguously, which is what trim needs); the rest is left to the next
    runs, each of which again takes the oldest. A stream with no row yet has
    no hole: its history before the first run is a backfill's business. The
    run's own interval ``[start_ms, end_ms)`` is always last (archiving it
    again is a cheap no-op). Chain streams are no different: the canonical job
    marks blocks filled in below canonical ones, and trim waits for it.
    """
    if not 0 <= start_ms < end_ms:
        raise ValueError(f"bad interval [{start_ms}, {end_ms})")
    width = end_ms - start_ms
    runs: list[list[int]] = []
    for lo, hi in sorted(i for i in logged if i[0] < i[1]):
        if runs and lo <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], hi)
        else:
            runs.append([lo, hi])
    holes: list[tuple[int, int]] = []
    if runs and runs[0][0] < start_ms:
        cursor = runs[0][1]
        for lo, hi in runs[1:] + [[start_ms, start_ms]]:
            holes.append((cursor, min(lo, start_ms)))
            cursor = max(cursor, hi)
            if cursor >= start_ms:
                break
    steps: list[tuple[int, int]] = []
    for lo, hi in holes:
        while lo < hi and len(steps) < max_steps:
            # the next grid line above lo (grid: start_ms - k * width)
            edge = start_ms - ((start_ms - lo - 1) // width) * width
            steps.append((lo, min(edge, hi)))
            lo = min(edge, hi)
    return [*steps, (start_ms, end_ms)]
