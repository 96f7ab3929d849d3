"""An S3 store that goes down while an archive's Spark tasks write to it (issue 33, 7).

The tasks' Parquet writes fail inside Spark's Python workers, and Spark's own
first line only says "An exception was thrown from the Python worker": the
job must end with one line naming the store's refusal instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.errors import LakePathError
from pipeline.lake.archive import archive_interval
from pipeline.lake.batch import archive_streams
from pipeline.lake.write import arrowbatch, arrowwrite
from pipeline.local.s3 import LocalStore
from tests.integration.lake.helpers import settings_for

pytestmark = pytest.mark.spark


def _stopping_before_the_tasks(monkeypatch: pytest.MonkeyPatch, own: LocalStore) -> None:
    """Stop the store once the driver planned the Spark tasks (from Redis alone): the next
    store request is a task's write of its Parquet file."""
    plan = arrowwrite.plan_task

    def then_stop(*args: Any, **kwargs: Any) -> Any:
        planned = plan(*args, **kwargs)
        own.stop()
        return planned

    monkeypatch.setattr(arrowwrite, "plan_task", then_stop)
    monkeypatch.setattr(arrowbatch, "plan_task", then_stop)


def _settings(redis_url: str, own: LocalStore) -> Any:
    # no retries of a refused request: the test waits for Spark, not for backoffs
    return settings_for(
        redis_url, lake_uri="s3://lake/l", lake_s3_max_retries=0, **own.lake_settings()
    )


def _plain(redis_client: Any, stream: str, n: int) -> None:
    for i in range(n):
        redis_client.xadd(keys.stream(stream), {b"v": b"%d" % i}, id=f"{1000 + i}-0")


def test_a_store_down_mid_archive_is_named_in_one_line(
    spark: Any,
    redis_client: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = LocalStore(tmp_path / "s3").start()
    try:
        own.create_bucket("lake")
        settings = _settings(redis_url, own)
        _plain(redis_client, "plain", 20)
        _stopping_before_the_tasks(monkeypatch, own)
        with pytest.raises(LakePathError) as failed:
            archive_interval(spark, settings, "plain", 1000, 1020)
        text = str(failed.value)
        assert "\n" not in text, text
        assert "Python worker" not in text, text
        assert "refused the connection" in text, text
        assert text.startswith("archive of 'plain' [1000, 1020) failed: "), text
    finally:
        own.stop()


def test_the_batch_jobs_stream_error_names_the_store(
    spark: Any,
    redis_client: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the DAG's run log shows: the stream's ``error`` in ``archive-streams``' result."""
    from contextlib import nullcontext

    own = LocalStore(tmp_path / "s3").start()
    try:
        own.create_bucket("lake")
        settings = _settings(redis_url, own)
        _plain(redis_client, "plain", 20)
        _stopping_before_the_tasks(monkeypatch, own)
        result, ok = archive_streams(
            spark, settings, ["plain"], 1000, 1020,
            locked=lambda stream: nullcontext(), check=lambda: None,
        )  # fmt: skip
        assert not ok and result["failed"] == ["plain"]
        error = result["streams"]["plain"]["error"]
        assert "Python worker" not in error and "refused the connection" in error, error
    finally:
        own.stop()


#: The archive through a Spark Connect client, as Airflow's tasks run it (a process is a
#: Connect client or a local driver, never both: so in a child). It holds after planning
#: its tasks until the test stopped the store, and prints the error it ended with.
THROUGH_CONNECT = """
import sys, time
from pathlib import Path
from pipeline.errors import LakeError
from pipeline.lake.archive import archive_interval
from pipeline.lake.spark.session import close_session, connect_session
from pipeline.lake.write import arrowwrite
from pipeline.settings import Settings

planned, stopped = Path(sys.argv[1]), Path(sys.argv[2])
plan = arrowwrite.plan_task

def then_hold(*args, **kwargs):
    tasks = plan(*args, **kwargs)
    planned.touch()
    deadline = time.monotonic() + 120
    while not stopped.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return tasks

arrowwrite.plan_task = then_hold
settings = Settings.load()
spark = connect_session(settings.spark.remote, shared=False)
try:
    archive_interval(spark, settings, "plain", 1000, 1020)
except LakeError as exc:
    print(type(exc).__name__, str(exc), sep=": ")
finally:
    close_session(spark)
"""


def test_a_store_down_under_a_connect_job_is_named_in_one_line(
    spark_remote: str, redis_client: Any, redis_url: str, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    from tests.support.poll import until_sync

    own = LocalStore(tmp_path / "s3").start()
    try:
        own.create_bucket("lake")
        _plain(redis_client, "plain", 20)
        env = {
            **os.environ,
            **{"SLUICE_" + k.upper(): str(v).lower() if isinstance(v, bool) else str(v)
               for k, v in own.lake_settings().items()},
            "SLUICE_LAKE_URI": "s3://lake/l", "SLUICE_REDIS_URL": redis_url,
            "SLUICE_STREAMS": "plain", "SLUICE_SPARK_REMOTE": spark_remote,
            "SLUICE_CONFIG": os.devnull, "SLUICE_LAKE_S3_MAX_RETRIES": "0",
        }  # fmt: skip
        planned, stopped = tmp_path / "planned", tmp_path / "stopped"
        err = tmp_path / "child.err"
        with err.open("wb") as sink:  # (a pipe nobody reads while it works could fill up)
            child = subprocess.Popen(
                [sys.executable, "-c", THROUGH_CONNECT, str(planned), str(stopped)],
                env=env, stdout=subprocess.PIPE, stderr=sink, text=True,
            )  # fmt: skip
        try:
            until_sync(lambda: planned.exists() or child.poll() is not None, "tasks planned",
                       within_s=120, every_s=0.05)  # fmt: skip
            own.stop()
            stopped.touch()
            out, _ = child.communicate(timeout=300)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        [line] = out.strip().splitlines() or ["(nothing)"]
        assert line == (
            "LakePathError: archive of 'plain' [1000, 1020) failed: a Spark task could not use "
            "the lake: the store refused the connection (is it running?)"
        ), out + err.read_text(errors="replace")[-3000:]
    finally:
        own.stop()
