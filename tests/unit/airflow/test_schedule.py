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


def test_retries_back_off_exponentially_with_a_cap() -> None:
    from sluice_dag_common import default_args

    args = default_args(Settings.load())
    assert args["retry_delay"] == timedelta(seconds=30)
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
