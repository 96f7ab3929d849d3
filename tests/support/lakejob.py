"""Run a lake job the way Airflow and a person do: a child ``python -m ...`` with ``SLUICE_*``.

A Connect client and a local driver cannot share one Python process (pyspark
switches its functions module per process), so integration tests run every
Spark job as a child, in its own process group (killed whole if the test
ends first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def log_rows(lake_uri: str, stream: str) -> list[tuple[int, int, int]]:
    """``(start_ms, end_ms, entries)`` of every ``archive_log`` row of ``stream``, in order."""
    from deltalake import DeltaTable

    from pipeline.lake.storage import tables
    from pipeline.settings import LakeSettings

    uri = LakeSettings.from_url(lake_uri).table(tables.ARCHIVE_LOG)
    if not DeltaTable.is_deltatable(uri):
        return []
    t = DeltaTable(uri).to_pyarrow_table(columns=["stream", "start_ms", "end_ms", "entries"])
    rows = zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True)
    return sorted((a, b, n) for s, a, b, n in rows if s == stream)


def job_env(
    redis_url: str, lake_uri: str, tmp_path: Path, remote: str = "", **extra: str
) -> dict[str, str]:
    """The environment of a job child: this process's minus its ``SLUICE_*``, plus the job's.

    ``extra`` adds ``SLUICE_*`` settings (``SLUICE_STREAMS="a,b"``); the
    defaults name one chain stream ``c``.
    """
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_LAKE_URI": lake_uri,
        "SLUICE_VAR_DIR": str(tmp_path / "var"),
        "SLUICE_SPARK_REMOTE": remote,
        "SLUICE_STREAMS": "c",
        "SLUICE_CHAIN_STREAMS": "c",
        "SLUICE_ARCHIVE_PARTITIONS": "2",
        "SLUICE_ARCHIVE_RANGE_ENTRIES": "1",
        "SLUICE_LAKE_LOCK_WAIT_S": "5",
        "SLUICE_CONFIG": os.devnull,  # no config file
        **extra,
    }


def start_job(
    env: dict[str, str], *args: str, module: str = "pipeline.lake.cli"
) -> subprocess.Popen[str]:
    """Start ``python -m MODULE ARGS`` (``pipeline.cli`` takes ``lake JOB ...``)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_job(
    env: dict[str, str], *args: str, timeout: float = 240, module: str = "pipeline.lake.cli"
) -> tuple[int, Any, str]:
    """Run a job to its end; returns (exit code, its JSON result or None, its stderr).

    Its stdout must be the JSON result alone (one line) or nothing.
    """
    with start_job(env, *args, module=module) as proc:  # closes the pipes however it ends
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    lines = out.strip().splitlines()
    assert len(lines) <= 1, out  # stdout: the JSON result only
    return proc.returncode, json.loads(lines[0]) if lines else None, err
