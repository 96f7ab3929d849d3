"""Which intervals one archive run archives: a new stream's backlog, the holes, then its own.

Pure (no Airflow, no Spark, no I/O: what Redis holds comes in as ``oldest_ms``
and a ``next_entry`` callable): the archive DAG's jobs and their tests share
it. See :func:`archive_steps`; :mod:`pipeline.lake.runsteps` reads its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pipeline.intervals import merge_intervals

#: Most earlier intervals holding entries one archive run catches up per stream, oldest
#: first, besides its own (empty stretches between them are one cheap step each).
CATCHUP_MAX_STEPS = 12
#: What a result keeps of each catch-up step (``caught_up``).
CAUGHT_UP_FIELDS = ("start_ms", "end_ms", "read", "entries", "blocks", "invalid", "warnings")

#: ``next_entry(ms)``: the millisecond of the stream's first entry at or after ``ms``, or None.
NextEntry = Callable[[int], int | None]


def archive_steps(
    logged: Iterable[tuple[int, int]],
    start_ms: int,
    end_ms: int,
    *,
    oldest_ms: int | None = None,
    next_entry: NextEntry | None = None,
    max_steps: int = CATCHUP_MAX_STEPS,
) -> list[tuple[int, int]]:
    """The intervals one archive task archives: earlier ones, oldest first, then its own.

    ``logged`` are the stream's ``archive_log`` intervals. Earlier intervals
    are the parts of ``[origin, start_ms)`` no row covers, where ``origin`` is
    the first row's start, or, when Redis holds an entry older than that
    (``oldest_ms``: a stream the run meets for the first time, or whose first
    runs left its older entries behind), the grid line at or below that entry:
    the stream is archived from its first entry, and coverage then holds the
    oldest entry in Redis, which is what trim needs. Pieces are cut on the
    grid of this run's interval (``end_ms - start_ms`` wide, anchored at
    ``start_ms``), so the rows look like the scheduler's.

    With ``next_entry``, a stretch of grid intervals holding no entry is one
    step (one cheap row, no Spark), and only steps that may hold entries count
    towards ``max_steps``; without it every grid interval is a step. At most
    ``max_steps`` such steps are returned, the oldest (coverage grows
    contiguously); the rest is left to the next runs, each of which again
    takes the oldest. The run's own interval ``[start_ms, end_ms)`` is always
    last (archiving it again is a cheap no-op). Chain streams are no
    different: the canonical job marks blocks filled in below canonical ones,
    and trim waits for it.
    """
    if not 0 <= start_ms < end_ms:
        raise ValueError(f"bad interval [{start_ms}, {end_ms})")
    width = end_ms - start_ms
    runs = merge_intervals(logged)
    origin = min(runs[0][0], start_ms) if runs else start_ms
    if oldest_ms is not None and 0 <= oldest_ms < origin:
        origin = max(0, _grid_floor(oldest_ms, start_ms, width))
    steps: list[tuple[int, int]] = []
    counted = 0
    for lo, hi in _holes(runs, origin, start_ms):
        while lo < hi and counted < max_steps:
            found = next_entry(lo) if next_entry is not None else lo
            if found is None or found >= hi:
                steps.append((lo, hi))  # nothing in the rest of the hole: one step
                break
            cell = max(lo, _grid_floor(found, start_ms, width))
            if cell > lo:
                steps.append((lo, cell))  # the empty stretch before the next entry
                lo = cell
            # the next grid line above lo (grid: start_ms - k * width)
            edge = start_ms - ((start_ms - lo - 1) // width) * width
            steps.append((lo, min(edge, hi)))
            counted += 1
            lo = min(edge, hi)
    return [*steps, (start_ms, end_ms)]


def _grid_floor(ms: int, start_ms: int, width: int) -> int:
    """The grid line (``start_ms - k * width``, k >= 0) at or below ``ms`` (< ``start_ms``)."""
    return start_ms - ((start_ms - ms + width - 1) // width) * width


def _holes(runs: list[tuple[int, int]], origin: int, start_ms: int) -> list[tuple[int, int]]:
    """The parts of ``[origin, start_ms)`` the merged ``runs`` do not cover, oldest first."""
    holes: list[tuple[int, int]] = []
    cursor = origin
    for lo, hi in runs:
        if lo >= start_ms:
            break
        if lo > cursor:
            holes.append((cursor, lo))
        cursor = max(cursor, hi)
    if cursor < start_ms:
        holes.append((cursor, start_ms))
    return holes
