"""The archive job on a real Spark standalone cluster (master + worker on loopback).

The master and the worker are started from pyspark's own launcher
(``$SPARK_HOME/bin/spark-class``, SPARK_HOME = the pyspark package; the pip
package ships no ``sbin/start-master.sh``) on free ports with small memory.
The job runs exactly as the ``sluice_archive`` DAG runs it: a child process
through the Airflow plugin's runner, with ``SLUICE_SPARK_MASTER=spark://...``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, encode_block
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.runtime.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
START_MS = 1_780_000_000_000
END_MS = START_MS + 300_000
READY_TIMEOUT_S = 90.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _cluster_env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(tmp / "local"),
        "SPARK_WORKER_DIR": str(tmp / "work"),
        "SPARK_DAEMON_MEMORY": "256m",
    }


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as resp:
        state: dict[str, Any] = json.load(resp)
        return state


def _wait_for(ui_port: int, check: Any, what: str, procs: list[subprocess.Popen[bytes]]) -> Any:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"a Spark daemon exited with {proc.returncode}"
        try:
            state = _master_state(ui_port)
        except OSError:
            state = None
        if state is not None and check(state):
            return state
        time.sleep(0.5)
    raise AssertionError(f"the standalone cluster never reached: {what}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A master and one worker (2 cores, 1 GB); yields (master URL, master UI port)."""
    env = _cluster_env(tmp_path)
    for sub in ("local", "work"):
        (tmp_path / sub).mkdir()
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    master = _start(
        [spark_class, "org.apache.spark.deploy.master.Master",
         "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
        env, tmp_path / "master.log",
    )  # fmt: skip
    procs = [master]
    try:
        _wait_for(ui_port, lambda s: s.get("status") == "ALIVE", "master ALIVE", procs)
        url = f"spark://127.0.0.1:{port}"
        worker = _start(
            [spark_class, "org.apache.spark.deploy.worker.Worker", url,
             "--host", "127.0.0.1", "--cores", "2", "--memory", "1g",
             "--webui-port", str(free_port()), "--work-dir", str(tmp_path / "work")],
            env, tmp_path / "worker.log",
        )  # fmt: skip
        procs.append(worker)
        _wait_for(ui_port, lambda s: len(s.get("workers", [])) >= 1 and s.get("aliveworkers", 0) >= 1,
                  "one alive worker", procs)  # fmt: skip
        yield url, ui_port
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_archive_job_runs_on_a_standalone_cluster(
    cluster: tuple[str, int], redis_url: str, tmp_path: Path
) -> None:
    sys.path.insert(0, str(ROOT / "plugins"))
    try:
        from sluice_lake_job import run_lake_job
    finally:
        sys.path.remove(str(ROOT / "plugins"))
    from deltalake import DeltaTable

    url, ui_port = cluster
    stream = "chain:cluster"
    chain = SyntheticChain(seed=5, reorg_every=7, reorg_depth=2)
    blocks = chain.take(40)
    client = redis.Redis.from_url(redis_url)
    try:
        pipe = client.pipeline(transaction=False)
        for i, block in enumerate(blocks):
            pipe.xadd(
                keys.stream(stream), {ENTRY_FIELD: encode_block(block)}, id=f"{START_MS + i}-0"
            )
        pipe.xadd(
            keys.stream(stream), {ENTRY_FIELD: encode_block(chain.take(1)[0])}, id=f"{END_MS}-0"
        )
        pipe.execute()
    finally:
        client.close()
    lake = str(tmp_path / "lake")
    result = run_lake_job(
        "archive",
        ["--stream", stream, "--start-ms", str(START_MS), "--end-ms", str(END_MS)],
        env={
            "SLUICE_SPARK_MASTER": url,
            "SLUICE_REDIS_URL": redis_url,
            "SLUICE_LAKE_URI": lake,
            "SLUICE_STREAMS": stream,
            "SLUICE_CHAIN_STREAMS": stream,
            "SLUICE_ARCHIVE_PARTITIONS": "2",
            "SLUICE_ARCHIVE_RANGE_ENTRIES": "1",
            "SLUICE_SPARK_SHUFFLE_PARTITIONS": "1",
            "SLUICE_SPARK_DRIVER_MEMORY": "768m",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(tmp_path / "driver-local"),
        },
        timeout_s=240,
    )
    assert isinstance(result, dict)
    hashes = sorted(
        DeltaTable(f"{lake}/blocks").to_pyarrow_table(columns=["hash"]).column("hash").to_pylist()
    )
    assert hashes == sorted(b.hash.hex() for b in blocks)
    log = DeltaTable(f"{lake}/archive_log").to_pyarrow_table().to_pylist()
    assert [(r["stream"], r["start_ms"], r["end_ms"], r["entries"]) for r in log] == [
        (stream, START_MS, END_MS, len(blocks))
    ]
    # The job really ran on this cluster, not in local mode.
    state = _master_state(ui_port)
    apps = state.get("completedapps", []) + state.get("activeapps", [])
    assert apps, f"no application ever registered with {url}"
