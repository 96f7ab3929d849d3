"""The DAG helpers: data intervals as entry-id milliseconds, the job environment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipeline.settings import Settings

pytestmark = pytest.mark.airflow


def test_interval_is_half_open_milliseconds(airflow_home: Path) -> None:
    from sluice_dag_common import interval_ms

    start = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    assert interval_ms(start, start + timedelta(minutes=5)) == (1780315200000, 1780315500000)


@pytest.mark.parametrize(
    ("start", "end", "error"),
    [
        (None, datetime(2026, 1, 1, tzinfo=UTC), "needs a data interval"),
        (datetime(2026, 1, 1), datetime(2026, 1, 2), "naive datetime"),
        (datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC), "empty data interval"),
    ],
)
def test_bad_intervals_are_refused(
    airflow_home: Path, start: datetime | None, end: datetime, error: str
) -> None:
    from sluice_dag_common import interval_ms

    with pytest.raises(ValueError, match=error):
        interval_ms(start, end)


def test_job_env_makes_the_lake_absolute_and_takes_redis_from_the_connection(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sluice_dag_common import default_args, job_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_REDIS", "redis://10.9.8.7:6390/2")
    settings = Settings.load(lake_uri="rel/lake", lake_task_retries=5, lake_job_timeout_s=60)
    assert job_env(settings) == {
        "SLUICE_REDIS_URL": "redis://10.9.8.7:6390/2",
        "SLUICE_LAKE_URI": str(tmp_path / "rel" / "lake"),
    }
    args = default_args(settings)
    assert args["retries"] == 5 and args["execution_timeout"] == timedelta(seconds=180)
