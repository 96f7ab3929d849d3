"""The archive pool's size, the run kinds' priority, and the pool created once, never resized."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest


def test_the_pool_keeps_a_quarter_of_the_executor_for_the_other_dags() -> None:
    from sluice_pools import archive_pool_slots

    assert [archive_pool_slots(p) for p in (1, 2, 3, 4, 8, 16, 32)] == [1, 1, 2, 3, 6, 12, 24]
    with pytest.raises(ValueError, match="parallelism must be at least 1"):
        archive_pool_slots(0)


def test_manual_runs_go_first_then_scheduled_then_backfills() -> None:
    from sluice_pools import run_bonus

    manual = run_bonus("manual__2026-11-29T03:45:21+00:00")
    scheduled = run_bonus("scheduled__2026-11-28T00:00:00+00:00")
    backfill = run_bonus("backfill__2026-11-27T00:00:00+00:00")
    assert manual > scheduled > backfill == 0
    # a run id given through the API is a manual run; so is an asset-triggered one
    assert run_bonus("my-rerun") == run_bonus("asset_triggered__x") == manual


def test_the_strategy_is_airflows_downstream_weight_plus_the_bonus() -> None:
    from airflow.task.priority_strategy import validate_and_load_priority_weight_strategy
    from sluice_pools import WEIGHT_RULE, RunKindPriority, run_bonus

    task = SimpleNamespace(priority_weight=3, get_dag=lambda: None)  # no DAG: its own weight
    ti = SimpleNamespace(task=task, run_id="scheduled__x")
    assert RunKindPriority().get_weight(ti) == 3 + run_bonus("scheduled__x")
    # registered by the plugin under the name the DAG gives it (the plugin loader runs the
    # module again under the same name: a class of the same name, not the same object)
    loaded = validate_and_load_priority_weight_strategy(WEIGHT_RULE)
    assert type(loaded).__qualname__ == RunKindPriority.__qualname__ == WEIGHT_RULE.split(".")[1]
    assert loaded.get_weight(ti) == RunKindPriority().get_weight(ti)


def test_the_pool_is_created_once_and_an_operators_size_stays() -> None:
    import sluice_airflow_internals as internals
    from airflow.models.pool import Pool

    name = f"sluice_test_{uuid.uuid4().hex[:8]}"
    try:
        assert internals.ensure_pool(name, 3, "test") is None  # created
        assert internals.ensure_pool(name, 5, "test") == 3  # found, left as it was
        Pool.create_or_update_pool(name, 7, "resized", include_deferred=False)
        assert internals.ensure_pool(name, 3, "test") == 7
        assert internals.executor_parallelism() >= 1
    finally:
        Pool.delete_pool(name)
