"""``sluice spark``: prints its URL, logs the JVM to a file, and stops with its JVM on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.runtime.ports import free_port

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


def _server_pids(port: int) -> list[int]:
    """Processes whose command line names this Connect port (the JVM)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"spark.connect.grpc.binding.port={port}".encode() in cmd:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sluice_spark_prints_its_url_and_stops_with_its_jvm(
    tmp_path: Path, sig: signal.Signals
) -> None:
    port = free_port()
    log = tmp_path / "connect.log"
    env = {**os.environ, "SLUICE_CONFIG": os.devnull, "SLUICE_SPARK_DRIVER_MEMORY": "512m"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "spark", "--port", str(port),
         "--master", "local[1]", "--log-file", str(log)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url == f"sc://127.0.0.1:{port}", proc.stderr.read() if proc.stderr else ""
        assert _server_pids(port), "no JVM listens for the printed URL"
        assert log.stat().st_size > 0  # the JVM's output went to the log file
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while _server_pids(port):
            assert time.monotonic() < deadline, "the JVM outlived sluice spark"
            time.sleep(0.1)
        err = proc.stderr.read() if proc.stderr else ""
        assert "stopped" in err and "log4j" not in err.lower(), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for pid in _server_pids(port):
            os.kill(pid, signal.SIGKILL)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
