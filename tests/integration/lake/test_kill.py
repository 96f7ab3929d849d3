"""A job killed mid-write leaves nothing half-written visible, and a rerun completes it exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipeline.lake.archive import archive_interval
from pipeline.lake.storage import tables
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import chain, publish, settings_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N = 10_000
ROOT = Path(__file__).resolve().parents[3]


def _rows(lake: LakeSettings, name: str) -> Any:
    uri = lake.table(name)
    if not DeltaTable.is_deltatable(uri):
        return None
    return DeltaTable(uri).to_pyarrow_table()


def _parquet_files(lake: LakeSettings) -> list[Path]:
    return [
        p
        for name in (tables.STREAM_ENTRIES, tables.BLOCKS)
        for p in Path(lake.table(name)).rglob("*.parquet")
    ]


def test_killed_archive_is_invisible_then_rerun_is_exact(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    blocks = chain(0, N, size=250)
    for start in range(0, N, 10_000):
        publish(redis_client, "c", blocks[start : start + 10_000], first_ms=1000 + start)
    lake = LakeSettings.from_url(lake_uri)
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_LAKE_URI": lake_uri,
        "SLUICE_SPARK_MASTER": "local[1]",
        "SLUICE_CHAIN_STREAMS": "c",
        "SLUICE_STREAMS": "c",
        "SLUICE_ARCHIVE_PARTITIONS": "2",
        "SLUICE_ARCHIVE_RANGE_ENTRIES": "1",
        "SLUICE_CONFIG": os.devnull,  # no config file
        "SPARK_LOCAL_DIRS": str(tmp_path / "spark"),
    }
    args = ["archive", "--stream", "c", "--start-ms", "1000", "--end-ms", str(1000 + N)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.lake.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,  # (a pipe nobody reads would leak, and could fill)
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not _parquet_files(lake):
            assert proc.poll() is None, "the archive job ended before writing anything"
            assert time.monotonic() < deadline, "the archive job never started writing"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # the job's own process group: python, JVM, workers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # Only whole commits are visible: each table holds all of the interval or none of it.
    log = _rows(lake, tables.ARCHIVE_LOG)
    assert log is None or log.num_rows == 0
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        table = _rows(lake, name)
        assert table is None or table.num_rows in (0, N), name

    result = archive_interval(spark, settings_for(redis_url, lake_uri), "c", 1000, 1000 + N)
    assert (result.entries, result.blocks, result.invalid) == (N, N, 0)
    entries = _rows(lake, tables.STREAM_ENTRIES)
    assert entries.num_rows == N and pc.count_distinct(entries.column("entry_id")).as_py() == N
    block_table = _rows(lake, tables.BLOCKS)
    assert block_table.num_rows == N
    assert sorted(block_table.column("num").to_pylist()) == list(range(N))
    assert set(block_table.column("hash").to_pylist()) == {b.hash.hex() for b in blocks}
    assert _rows(lake, tables.ARCHIVE_LOG).num_rows == 1
