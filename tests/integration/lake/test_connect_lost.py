"""A shared archive job that loses its Spark Connect server mid-job (issue 33, item 2).

The job waits for the server to listen again (``SLUICE_SPARK_RECONNECT_S``),
joins it with a new session and archives the streams it had not finished;
a server that does not come back in time fails the job with one line. Each
job runs as a child (``python -m pipeline.lake.cli``), as Airflow runs it,
against a private server this test kills (SIGKILL, JVM and workers) and
starts again on the same port. The bound is tested without a JVM
(tests/unit/lake/spark/test_lazyspark.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.lake.spark.server import ConnectServer
from pipeline.lake.write.jobs import HOLD_ENV
from pipeline.runtime.ports import free_port
from tests.integration.lake.connect import server_settings
from tests.support.lakejob import job_env, log_rows, start_job

pytestmark = [pytest.mark.spark, pytest.mark.slow]

W = 10_000  # interval width (ms)
STREAMS = [f"p{i}" for i in range(8)]
PER_STREAM = 300


class _Job:
    """A running ``archive-streams`` job whose stderr is read as it comes."""

    def __init__(self, env: dict[str, str], lo: int) -> None:
        args = [a for s in STREAMS for a in ("--stream", s)]
        self.proc = start_job(
            env, "archive-streams", *args, "--start-ms", str(lo), "--end-ms", str(lo + W)
        )
        self.lines: list[str] = []
        self._new = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._new:
                self.lines.append(line.rstrip("\n"))
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        with self._new:
            while not any(text in line for line in self.lines):
                assert self.proc.poll() is None or self._reader.is_alive(), self.err
                assert time.monotonic() < deadline, f"no {text!r} in:\n{self.err}"
                self._new.wait(0.5)

    def end(self, timeout: float = 240) -> tuple[int, str, str]:
        try:
            out = self.proc.stdout.read() if self.proc.stdout is not None else ""
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self._reader.join(10)
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
        return self.proc.returncode, out, self.err

    @property
    def err(self) -> str:
        return "\n".join(self.lines)


def _publish(client: Any, lo: int) -> None:
    for stream in STREAMS:
        pipe = client.pipeline(transaction=False)
        for i in range(PER_STREAM):
            pipe.xadd(keys.stream(stream), {b"n": str(i).encode()}, id=f"{lo + 1 + i}-0")
        pipe.execute()


def _lose_server_mid_job(job: _Job, server: ConnectServer, hold: Path) -> None:
    """Once the job archived its first stream (so its session is on ``server``), hold the
    next stream right before its Spark work, kill the server, and let the stream go on."""
    job.wait_for(f"stream {STREAMS[0]}: done in")
    hold.write_text("archive-streams")  # the next stream to reach Spark holds
    deadline = time.monotonic() + 60
    while not hold.read_text().startswith("pid:"):
        assert time.monotonic() < deadline and job.proc.poll() is None, job.err
        time.sleep(0.05)
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGKILL)  # the whole server: JVM and its workers
    server.proc.wait(30)
    hold.unlink()


def _env(redis_url: str, lake_uri: str, tmp_path: Path, url: str, wait_s: int) -> dict[str, str]:
    return job_env(
        redis_url, lake_uri, tmp_path, url,
        SLUICE_STREAMS=",".join(STREAMS), SLUICE_CHAIN_STREAMS="",
        SLUICE_ARCHIVE_JOB_WORKERS="1",  # one stream after the other: some not started yet
        SLUICE_SPARK_RECONNECT_S=str(wait_s), **{HOLD_ENV: str(tmp_path / "hold")},
    )  # fmt: skip


def test_a_lost_server_is_waited_for_and_the_job_resumes_its_streams(
    redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    _publish(redis_client, 0)
    port = free_port()
    first = ConnectServer(server_settings(), port=port, log_path=tmp_path / "a.log").start()
    second: ConnectServer | None = None
    try:
        job = _Job(_env(redis_url, lake_uri, tmp_path, first.url, 120), 0)
        _lose_server_mid_job(job, first, tmp_path / "hold")
        job.wait_for("went away: waiting up to 120s")
        # Back on the same port, the way an operator restarts it.
        second = ConnectServer(server_settings(), port=port, log_path=tmp_path / "b.log").start()
        code, out, err = job.end()
        assert code == 0, err
        assert f"{len(STREAMS)} of {len(STREAMS)} stream(s) archived" in err, err
        # One wait, one new session: the streams that lost the server waited for the same
        # outcome, and the new session reached the server that was back at once.
        assert err.count("went away: waiting") == 1 and err.count("is back after") == 1, err
        # Every stream exactly once: those archived before the loss were found, not redone.
        for stream in STREAMS:
            assert log_rows(lake_uri, stream) == [(0, W, PER_STREAM)], stream

    finally:
        first.stop()
        if second is not None:
            second.stop()
