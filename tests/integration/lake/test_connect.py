"""Lake jobs as thin Spark Connect clients of the session's server (``SLUICE_SPARK_REMOTE``).

Each job runs as ``python -m pipeline.lake.cli`` in a child process, as
Airflow runs it: a Connect client and a local driver cannot share one Python
process (pyspark switches its functions module per process).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline.lake.storage import tables
from pipeline.runtime.ports import free_port
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import chain, publish
from tests.support.lakejob import job_env as _job_env
from tests.support.lakejob import run_job, start_job

pytestmark = [pytest.mark.spark]


def job_env(redis_url: str, lake_uri: str, tmp_path: Path, remote: str) -> dict[str, str]:
    return _job_env(redis_url, lake_uri, tmp_path, remote, SLUICE_LAKE_LOCK_WAIT_S="2")


NOISE = ("ivy", "log4j", ":: ", "WARN NativeCodeLoader", "py4j", "SparkContext")


def log_rows(lake_uri: str) -> int:
    uri = LakeSettings.from_url(lake_uri).table(tables.ARCHIVE_LOG)
    return DeltaTable(uri).to_pyarrow_table().num_rows if DeltaTable.is_deltatable(uri) else 0


def test_archive_through_connect_tells_its_story(
    spark_remote: str, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    publish(redis_client, "c", chain(0, 500), first_ms=1000)
    env = job_env(redis_url, lake_uri, tmp_path, spark_remote)
    args = ("archive", "--stream", "c", "--start-ms", "1000", "--end-ms", "2000")
    code, doc, err = run_job(env, *args)
    assert code == 0, err
    assert (doc["entries"], doc["blocks"], doc["invalid"]) == (500, 500, 0)
    assert doc["spark"] == f"Spark Connect {spark_remote}"
    assert doc["warnings"] == 0
    lines = err.strip().splitlines()
    # A few lines, each with its level first, none of Spark's own noise.
    assert 2 <= len(lines) <= 8, err
    assert all(line.split(" ", 1)[0] in ("INFO", "WARNING", "ERROR") for line in lines), err
    assert not [line for line in lines if any(n in line for n in NOISE)], err
    assert "500 entries read" in err and "entries/s" in err
    assert (tmp_path / "var" / "logs" / "lake-jobs.log").exists()
    # A rerun of the archived interval (a manual trigger) and an interval with nothing
    # in Redis are settled without Spark: no session at all.
    code, again, err = run_job(env, *args)
    assert code == 0 and again["skipped"] and again["spark"] == "not started", err
    assert (again["entries"], again["read"]) == (500, 0)
    code, empty, err = run_job(env, *args[:3], "--start-ms", "5000", "--end-ms", "6000")
    assert code == 0 and empty["spark"] == "not started" and empty["entries"] == 0, err
    # The canonical job through the same server.
    code, doc, err = run_job(env, "canonical", "--stream", "c")
    assert code == 0, err
    assert doc["head_num"] == 499


def test_invalid_entries_are_warnings_counted_in_the_result(
    spark_remote: str, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    from pipeline import keys
    from pipeline.blockcodec import encode_block
    from pipeline.lake.storage.entries import read_entries

    blocks = chain(0, 10)
    publish(redis_client, "c", blocks, first_ms=1000)
    redis_client.xadd(keys.stream("c"), {"block": b"not msgpack"}, id="1500-0")
    # A block published twice: through Connect too, its second entry keeps its payload.
    redis_client.xadd(keys.stream("c"), {"block": encode_block(blocks[3])}, id="1501-0")
    env = job_env(redis_url, lake_uri, tmp_path, spark_remote)
    code, doc, err = run_job(
        env, "archive", "--stream", "c", "--start-ms", "1000", "--end-ms", "2000"
    )
    assert code == 0, err
    assert doc["invalid"] == 1 and doc["warnings"] >= 1
    assert any(line.startswith("WARNING ") and "1500-0" in line for line in err.splitlines()), err
    got = [(e.entry_id, e.fields) for e in read_entries(lake_uri, "c")]
    assert got == [
        (i.decode(), {k.decode(): v for k, v in f.items()})
        for i, f in redis_client.xrange(keys.stream("c"))
    ]


def test_server_down_is_one_line_naming_the_url(
    redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    publish(redis_client, "c", chain(0, 5), first_ms=1000)
    url = f"sc://127.0.0.1:{free_port()}"
    env = job_env(redis_url, lake_uri, tmp_path, url)
    code, doc, err = run_job(
        env, "archive", "--stream", "c", "--start-ms", "1000", "--end-ms", "2000"
    )
    assert code == 1 and doc is None
    errors = [line for line in err.splitlines() if line.startswith("sluice lake:")]
    assert len(errors) == 1 and url in errors[0] and "not reachable" in errors[0], err
    assert "Traceback" not in err
    assert log_rows(lake_uri) == 0


def test_sigterm_stops_the_job_before_it_commits(
    spark_remote: str, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    n = 20_000
    blocks = chain(0, n, size=64)
    for start in range(0, n, 5000):
        publish(redis_client, "c", blocks[start : start + 5000], first_ms=1000 + start)
    env = job_env(redis_url, lake_uri, tmp_path, spark_remote)
    args = ("archive", "--stream", "c", "--start-ms", "1000", "--end-ms", str(1000 + n))
    proc = start_job(env, *args)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # wait until the job is inside Spark
            if "session ready" in line:
                break
            assert time.monotonic() < deadline
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)  # bounds a hang; how fast it stops is not this test's
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):  # (stdout is never read)
            if pipe is not None:
                pipe.close()
    assert proc.returncode in (143, -signal.SIGTERM), proc.returncode
    assert log_rows(lake_uri) == 0
    # Nothing half-written: the rerun completes the interval exactly.
    code, doc, err = run_job(env, *args)
    assert code == 0, err
    assert (doc["entries"], doc["blocks"]) == (n, n)
    assert log_rows(lake_uri) == 1


def test_a_locked_stream_waits_then_fails_naming_the_holder(
    spark_remote: str, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    from pipeline.lake.lock import StreamLock
    from pipeline.settings import LakeSettings

    publish(redis_client, "c", chain(0, 5), first_ms=1000)
    env = job_env(redis_url, lake_uri, tmp_path, spark_remote)
    args = ("archive", "--stream", "c", "--start-ms", "1000", "--end-ms", "2000")
    with StreamLock(redis_url, "c", lake=LakeSettings.from_url(lake_uri), owner="other-task"):
        code, doc, err = run_job(env, *args)
    assert code == 1 and doc is None
    assert "locked by other-task" in err, err
    assert log_rows(lake_uri) == 0
    code, doc, err = run_job(env, *args)
    assert code == 0 and doc["entries"] == 5, err


@pytest.mark.slow
def test_server_killed_mid_job_fails_clearly_and_the_rerun_completes(
    redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path, spark_remote: str
) -> None:
    from pipeline.lake.spark.server import ConnectServer
    from tests.integration.lake.connect import server_settings

    n = 20_000
    blocks = chain(0, n, size=64)
    for start in range(0, n, 5000):
        publish(redis_client, "c", blocks[start : start + 5000], first_ms=1000 + start)
    port = free_port()
    server = ConnectServer(server_settings(), port=port, log_path=tmp_path / "connect.log")
    server.start()
    env = job_env(redis_url, lake_uri, tmp_path, server.url)
    args = ("archive", "--stream", "c", "--start-ms", "1000", "--end-ms", str(1000 + n))
    try:
        proc = start_job(env, *args)
        assert proc.stderr is not None
        for line in proc.stderr:
            if "session ready" in line:
                break
        assert server.proc is not None
        os.killpg(server.proc.pid, signal.SIGKILL)  # the whole server: JVM and its workers
        out, err = proc.communicate(timeout=120)  # bounds a hang only
    finally:
        server.stop()
    assert proc.returncode == 1, (out, err)
    errors = [line for line in err.splitlines() if line.startswith("sluice lake:")]
    assert len(errors) == 1, err
    assert "went away" in errors[0] or "not reachable" in errors[0], err
    # Nothing half-written is visible; a rerun against another server (the session's: the
    # killed one is gone for good) completes exactly.
    assert log_rows(lake_uri) == 0
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        uri = LakeSettings.from_url(lake_uri).table(name)
        if DeltaTable.is_deltatable(uri):
            assert DeltaTable(uri).to_pyarrow_table(columns=["stream"]).num_rows in (0, n)
    code, doc, err = run_job(job_env(redis_url, lake_uri, tmp_path, spark_remote), *args)
    assert code == 0, err
    assert (doc["entries"], doc["blocks"]) == (n, n)
    assert log_rows(lake_uri) == 1
