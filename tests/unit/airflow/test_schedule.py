"""How the lake DAGs are scheduled: archive catch-up steps, retry backoff, maintenance timing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipeline.settings import Settings

# sluice_dag_common imports Airflow: never at collection time (the session's
# airflow_home fixture must configure Airflow before its first import).
CATCHUP_MAX_STEPS = 12
W = 300_000  # a 5-minute interval in ms
S = 1_780_000_200_000  # a run's data_interval_start (on the 5-minute grid)


def archive_steps(*args: Any, **kwargs: Any) -> list[tuple[int, int]]:
    from pipeline.lake.catchup import archive_steps as steps

    result: list[tuple[int, int]] = steps(*args, **kwargs)
    return result


def test_the_catch_up_bound_is_the_documented_one() -> None:
    from pipeline.lake.catchup import CATCHUP_MAX_STEPS as bound

    assert bound == CATCHUP_MAX_STEPS


def test_a_stream_without_rows_archives_only_its_own_interval() -> None:
    assert archive_steps([], S, S + W) == [(S, S + W)]


def test_contiguous_coverage_has_nothing_to_catch_up() -> None:
    logged = [(S - 2 * W, S - W), (S - W, S)]
    assert archive_steps(logged, S, S + W) == [(S, S + W)]
    # the run's own interval archived already: it is still run (a cheap no-op)
    assert archive_steps([*logged, (S, S + W)], S, S + W) == [(S, S + W)]


def test_skipped_intervals_are_archived_oldest_first_before_its_own() -> None:
    # the scheduler skipped three intervals while a run overran
    logged = [(S - 5 * W, S - 4 * W), (S - 4 * W, S - 3 * W)]
    assert archive_steps(logged, S, S + W) == [
        (S - 3 * W, S - 2 * W),
        (S - 2 * W, S - W),
        (S - W, S),
        (S, S + W),
    ]


def test_a_hole_between_rows_is_filled_and_cut_on_the_run_grid() -> None:
    # a failed run left [S-4W, S-3W) out; a row off the grid ends at S-3W+1000
    logged = [(S - 6 * W, S - 4 * W), (S - 3 * W + 1000, S)]
    assert archive_steps(logged, S, S + W) == [
        (S - 4 * W, S - 3 * W),
        (S - 3 * W, S - 3 * W + 1000),
        (S, S + W),
    ]
    # a hole that does not start on the grid: the first step ends at the grid line
    assert archive_steps([(0, S - W - 7)], S, S + W) == [(S - W - 7, S - W), (S - W, S), (S, S + W)]


def test_an_interior_hole_and_the_tail_hole_are_both_filled_oldest_first() -> None:
    # a failed run left [S-4W, S-3W) out, then the scheduler skipped [S-W, S)
    logged = [(S - 6 * W, S - 4 * W), (S - 3 * W, S - W)]
    assert archive_steps(logged, S, S + W) == [(S - 4 * W, S - 3 * W), (S - W, S), (S, S + W)]
    # no row before the run, or coverage up to its start: only its own interval
    assert archive_steps([], S, S + W) == [(S, S + W)]
    assert archive_steps([(S - 2 * W, S)], S, S + W) == [(S, S + W)]


def test_at_most_max_steps_are_caught_up_oldest_first() -> None:
    first = S - 100 * W
    steps = archive_steps([(first - W, first)], S, S + W)
    assert len(steps) == CATCHUP_MAX_STEPS + 1
    assert steps[0] == (first, first + W)
    assert steps[-2] == (first + (CATCHUP_MAX_STEPS - 1) * W, first + CATCHUP_MAX_STEPS * W)
    assert steps[-1] == (S, S + W)
    # each run takes the oldest again, so coverage converges run by run
    assert archive_steps([(first - W, first)], S, S + W, max_steps=2)[:2] == [
        (first, first + W),
        (first + W, first + 2 * W),
    ]


def test_coverage_after_the_run_is_not_a_hole_and_bad_intervals_fail() -> None:
    # a backfill or a later run archived after this interval: not this run's business
    assert archive_steps([(S - W, S), (S + 3 * W, S + 4 * W)], S, S + W) == [(S, S + W)]
    with pytest.raises(ValueError):
        archive_steps([], S, S)


def _next_entry(entries: list[int]) -> Any:
    """``next_entry`` over entry milliseconds (what Redis would answer)."""
    return lambda ms: min((e for e in entries if e >= ms), default=None)


def test_a_new_stream_is_archived_from_its_first_entry() -> None:
    # no row yet; Redis holds entries from 2.5 intervals before the run's own
    entries = [S - 2 * W - W // 2, S - W + 5, S - 1, S + 10]
    steps = archive_steps([], S, S + W, oldest_ms=entries[0], next_entry=_next_entry(entries))
    # from the grid line below its first entry: coverage holds it, so trim can move
    assert steps == [(S - 3 * W, S - 2 * W), (S - 2 * W, S - W), (S - W, S), (S, S + W)]
    # the same without the probe: every grid interval is a step
    assert archive_steps([], S, S + W, oldest_ms=entries[0]) == steps
    # entries only in (or after) its own interval: nothing earlier to do
    assert archive_steps([], S, S + W, oldest_ms=S + 10) == [(S, S + W)]


def test_entries_older_than_the_first_row_are_archived_before_the_holes() -> None:
    # an earlier run archived [S-2W, S-W) only; Redis still holds an entry from S-4W
    entries = [S - 4 * W + 3, S - W + 1]
    logged = [(S - 2 * W, S - W)]
    steps = archive_steps(logged, S, S + W, oldest_ms=entries[0], next_entry=_next_entry(entries))
    assert steps == [(S - 4 * W, S - 3 * W), (S - 3 * W, S - 2 * W), (S - W, S), (S, S + W)]
    # coverage that already holds the oldest entry: the usual holes only
    assert archive_steps(logged, S, S + W, oldest_ms=S - 2 * W + 1) == [(S - W, S), (S, S + W)]


def test_empty_stretches_are_one_step_each_and_do_not_count() -> None:
    # entries 100 and 40 intervals back, nothing between: four steps, not a hundred
    entries = [S - 100 * W + 7, S - 40 * W]
    steps = archive_steps([], S, S + W, oldest_ms=entries[0], next_entry=_next_entry(entries))
    assert steps == [
        (S - 100 * W, S - 99 * W),  # the first entry's interval
        (S - 99 * W, S - 40 * W),  # empty: one row
        (S - 40 * W, S - 39 * W),  # the second entry's interval
        (S - 39 * W, S),  # empty up to the run's own
        (S, S + W),
    ]
    # the bound counts the intervals that hold entries: the rest waits for the next run
    busy = [S - k * W for k in range(30, 0, -1)]
    steps = archive_steps([], S, S + W, oldest_ms=busy[0], next_entry=_next_entry(busy))
    assert len(steps) == CATCHUP_MAX_STEPS + 1
    assert steps[0] == (S - 30 * W, S - 29 * W) and steps[-2] == (S - 19 * W, S - 18 * W)
    # the next run (those twelve logged) goes on from there
    logged = [(S - 30 * W, S - 18 * W), (S, S + W)]
    again = archive_steps(logged, S + W, S + 2 * W, oldest_ms=busy[0], next_entry=_next_entry(busy))
    assert again[0] == (S - 18 * W, S - 17 * W) and len(again) == CATCHUP_MAX_STEPS + 1


def test_a_hole_without_entries_is_one_step() -> None:
    logged = [(S - 10 * W, S - 9 * W)]
    assert archive_steps(logged, S, S + W, next_entry=_next_entry([S + 1])) == [
        (S - 9 * W, S),
        (S, S + W),
    ]


def test_retries_back_off_exponentially_with_a_cap() -> None:
    from sluice_dag_common import default_args

    args = default_args(Settings.load())
    assert args["retry_delay"] == timedelta(seconds=10)
    assert args["retry_exponential_backoff"] == 2.0
    assert args["max_retry_delay"] == timedelta(minutes=10)


def test_maintenance_runs_on_its_schedule_only_never_at_start() -> None:
    import importlib.util
    from pathlib import Path

    from airflow.timetables.base import TimeRestriction

    path = Path(__file__).resolve().parents[3] / "dags" / "sluice_maintenance.py"
    spec = importlib.util.spec_from_file_location("sluice_maintenance_dag", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.sluice_maintenance()
    assert dag.start_date is None and dag.catchup is False
    # What the scheduler asks when the DAG is first seen (no run yet): the next
    # 03:00 in the future, never the last one already past, at any time of day
    # (just after 03:00 included: Airflow's default runs the past one then).
    import airflow.timetables.trigger as trigger

    day = datetime(2026, 11, 27, tzinfo=UTC)
    for now in (
        day + timedelta(hours=h, minutes=m) for h, m in ((3, 1), (4, 59), (12, 0), (2, 59))
    ):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trigger, "utcnow", lambda now=now: now)
            info = dag.timetable.next_dagrun_info(
                last_automated_data_interval=None,
                restriction=TimeRestriction(earliest=None, latest=None, catchup=False),
            )
        assert info is not None
        assert now < info.run_after <= now + timedelta(days=1), now
        assert (info.run_after.hour, info.run_after.minute) == (3, 0)
