"""The DAG folder loads cleanly and each DAG has the shape the lake design asks for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.airflow.conftest import ROOT

pytestmark = pytest.mark.airflow

EXPECTED = {"sluice_archive", "sluice_audit", "sluice_maintenance", "sluice_replay"}


@pytest.fixture(scope="module")
def bag(airflow_home: Path) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_dagbag_loads_every_dag_without_import_errors(bag: Any) -> None:
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == EXPECTED


def test_archive_dag_is_an_interval_timetable_with_catchup_off(bag: Any) -> None:
    from airflow.timetables.interval import CronDataIntervalTimetable

    dag = bag.get_dag("sluice_archive")
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.timetable.serialize()["expression"] == "*/5 * * * *"
    # two runs at once: a manual run starts beside the scheduled one
    assert dag.catchup is False and dag.max_active_runs == 2
    assert {t.task_id for t in dag.tasks} == {
        "streams", "shards", "chain_streams", "archive_streams", "archive", "canonical", "trim",
        "publish",
    }  # fmt: skip
    archive, canonical, trim = (dag.get_task(t) for t in ("archive", "canonical", "trim"))
    # one job for every stream, then each shard's results (a task per shard, not per stream)
    assert dag.get_task("archive_streams").downstream_task_ids == {"archive"}
    assert "shards" in archive.upstream_task_ids and archive.is_mapped
    assert "streams" in dag.get_task("archive_streams").upstream_task_ids
    assert "canonical" in archive.downstream_task_ids
    assert "trim" in canonical.downstream_task_ids and "trim" in archive.downstream_task_ids
    # one trim job for every stream (not mapped), its result per stream in its XCom
    assert trim.job == "trim-streams" and not trim.is_mapped
    # every task in the archive pool (created by plugins/sluice_pools.py), which bounds all
    # runs together; archive_streams is not bounded across runs (a backfill goes beside the
    # scheduled run), canonical by SLUICE_ARCHIVE_PARALLELISM
    assert {t.pool for t in dag.tasks} == {"sluice_archive"}
    # in it manual runs first, then scheduled ones, then backfills (by the run's kind)
    assert {str(t.weight_rule) for t in dag.tasks} == {"sluice_pools.RunKindPriority"}
    assert dag.get_task("archive_streams").max_active_tis_per_dag is None
    assert canonical.max_active_tis_per_dag == 1
    assert archive.max_active_tis_per_dag is None and trim.max_active_tis_per_dag is None
    for other in ("sluice_audit", "sluice_maintenance", "sluice_replay"):
        assert {t.pool for t in bag.get_dag(other).tasks} == {"default_pool"}, other
    assert [o.uri for o in dag.get_task("publish").outlets] == ["sluice://lake/blocks"]
    assert trim.trigger_rule == "none_failed"


def test_archive_cron_comes_from_settings(airflow_home: Path) -> None:
    # A fresh interpreter: the DAG reads SLUICE_ARCHIVE_CRON when it is parsed.
    code = (
        "from airflow.dag_processing.dagbag import DagBag;"
        f"b = DagBag(dag_folder={str(ROOT / 'dags')!r});"
        "print(b.get_dag('sluice_archive').timetable.serialize()['expression'])"
    )
    import os

    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "SLUICE_ARCHIVE_CRON": "*/15 * * * *"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "*/15 * * * *"


def test_a_bad_setting_is_a_clear_import_error(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("SLUICE_ARCHIVE_PARALLELISM", "many")
    bag = DagBag(dag_folder=str(ROOT / "dags" / "sluice_archive.py"))
    assert len(bag.import_errors) == 1
    assert "archive_parallelism" in next(iter(bag.import_errors.values()))


def test_audit_runs_on_the_lake_asset_and_the_others_on_their_schedules(bag: Any) -> None:
    audit = bag.get_dag("sluice_audit")
    assert "sluice://lake/blocks" in repr(audit.timetable)
    maintenance = bag.get_dag("sluice_maintenance")
    # 03:00 UTC as a trigger timetable: it never runs a "missed" day at start-up
    assert type(maintenance.timetable).__name__ == "CronTriggerTimetable"
    assert maintenance.timetable.summary == "0 3 * * *" and maintenance.start_date is None
    assert maintenance.params["retain_hours"] == 168
    replay = bag.get_dag("sluice_replay")
    assert type(replay.timetable).__name__ == "NullTimetable"
    assert set(replay.params.keys()) == {"stream", "from_num", "to_num", "target"}


def test_dag_files_do_not_import_spark_or_pandas_at_parse_time(airflow_home: Path) -> None:
    code = (
        "import sys;"
        "from airflow.dag_processing.dagbag import DagBag;"
        f"b = DagBag(dag_folder={str(ROOT / 'dags')!r});"
        "assert not b.import_errors, b.import_errors;"
        "print(sorted(m for m in ('pyspark', 'delta', 'deltalake') if m in sys.modules))"
    )
    import os

    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "[]"
