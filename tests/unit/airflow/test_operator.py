"""``LakeJobOperator``: the task runner's SIGTERM (``on_kill``) stops the job at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = str(ROOT / "plugins")
HERE = str(Path(__file__).resolve().parent)

#: A task process as Airflow 3.3's task runner makes it: SIGTERM calls the
#: operator's on_kill (and nothing else), while execute() runs the job.
TASK = f"""
import signal, sys
sys.path[:0] = [{PLUGINS!r}, {HERE!r}]
from sluice_lake_operator import LakeJobOperator
op = LakeJobOperator(task_id="archive", job="hang", extra_args=[sys.argv[1]], module="job_child")
signal.signal(signal.SIGTERM, lambda signum, frame: op.on_kill())
try:
    op.execute({{}})
except Exception as exc:
    print("FAILED", type(exc).__name__, exc, flush=True)
    sys.exit(1)
print("RETURNED", flush=True)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie child of a dead parent counts as gone once reaped by init.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_on_kill_stops_the_job_at_once(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    env = {
        **os.environ,
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LAKE_JOB_TIMEOUT_S": "120",
        "PYTHONPATH": os.pathsep.join([HERE, str(ROOT)]),
    }
    task = subprocess.Popen(
        [sys.executable, "-c", TASK, str(pids)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and len(pids.read_text().split()) == 2):
            assert task.poll() is None, "the task ended before its job started"
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        child, grandchild = map(int, pids.read_text().split())
        task.send_signal(signal.SIGTERM)  # what "Mark failed" makes the supervisor send
        out, _ = task.communicate(timeout=30)
        # The job and everything it started are gone, well before Airflow's SIGKILL would come.
        deadline = time.monotonic() + 5
        while not (_gone(child) and _gone(grandchild)):
            assert time.monotonic() < deadline, "the job survived on_kill"
            time.sleep(0.05)
        assert "FAILED LakeJobError" in out, out
    finally:
        if task.poll() is None:
            task.kill()
            task.wait(timeout=10)


def test_lake_dags_that_users_expect_running_are_unpaused_on_creation() -> None:
    import ast

    for name, expected in {
        "sluice_archive": False,
        "sluice_audit": False,
        "sluice_maintenance": False,
        "sluice_replay": False,
    }.items():
        tree = ast.parse((ROOT / "dags" / f"{name}.py").read_text())
        values = [
            kw.value.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            for kw in node.keywords
            if kw.arg == "is_paused_upon_creation" and isinstance(kw.value, ast.Constant)
        ]
        assert values == [expected], name


@pytest.mark.parametrize(
    ("line", "level"),
    [("WARNING stream c: 1 invalid", 30), ("INFO done", 20), ("ERROR stopped", 40)],
)
def test_job_lines_keep_their_level(
    line: str, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    sys.path.insert(0, PLUGINS)
    from sluice_lake_job import forward_line

    caplog.set_level("DEBUG", logger="sluice_lake_job")
    forward_line(line)
    assert caplog.records[-1].levelno == level
    assert caplog.records[-1].getMessage() == line.split(" ", 1)[1]


def _context(run_type: str = "scheduled", **extra: Any) -> dict[str, Any]:
    from datetime import UTC, datetime
    from types import SimpleNamespace

    return {
        "data_interval_start": datetime.fromtimestamp(0.3, UTC),
        "data_interval_end": datetime.fromtimestamp(0.4, UTC),
        "run_id": "r1",
        "dag_run": SimpleNamespace(run_type=run_type),
        **extra,
    }


def _operators() -> Any:
    sys.path.insert(0, PLUGINS)
    sys.path.insert(0, HERE)
    import sluice_lake_operator

    return sluice_lake_operator


def test_one_job_archives_every_stream_with_catch_up_except_in_backfills() -> None:
    ops = _operators()
    op = ops.ArchiveStreamsOperator(task_id="archive_streams", streams=["a", "b"])
    args = ["--stream", "a", "--stream", "b", "--start-ms", "300", "--end-ms", "400"]
    assert op.job_args(_context()) == [*args, "--run-id", "r1", "--catchup"]
    # a backfill's own runs cover the other intervals: no catch-up steps
    assert op.job_args(_context("backfill")) == [*args, "--run-id", "r1"]
    shard = ops.StreamArchiveOperator(task_id="archive", streams=["b", "c"])
    assert shard.job_args(_context())[:4] == ["--stream", "b", "--stream", "c"]


class _TI:
    """What a task gets as ``context["ti"]``: its try number and the shared job's XCom."""

    def __init__(self, try_number: int, shared: Any) -> None:
        self.try_number = try_number
        self.shared = shared
        self.pulled: list[tuple[str, int]] = []

    def xcom_pull(self, *, task_ids: str, map_indexes: int) -> Any:
        self.pulled.append((task_ids, map_indexes))
        return self.shared


def test_a_shard_task_takes_its_results_from_the_shared_job_or_archives_the_rest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SLUICE_CONFIG", os.devnull)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, str(ROOT)]))
    caplog.set_level("INFO")
    ops = _operators()
    op = ops.StreamArchiveOperator(task_id="archive", streams=["a", "b"], module="job_child")
    mine = {"a": {"stream": "a", "entries": 5, "warnings": 0}}
    done = {"streams": {**mine, "b": {"stream": "b", "entries": 7, "warnings": 0}}, "failed": []}
    ti = _TI(1, done)
    # first try, both archived by the shared job: their results, and no job of its own
    assert op.execute(_context(ti=ti)) == [done["streams"]["a"], done["streams"]["b"]]
    assert ti.pulled == [("archive_streams", -1)]
    assert "archived by this task" not in caplog.text
    # b failed there (or the job left no result for it): this task archives b, alone
    failed = {"streams": {**mine, "b": {"stream": "b", "error": "boom"}}, "failed": ["b"]}
    for shared in (failed, {"streams": mine, "failed": []}):
        caplog.clear()
        got = op.execute(_context(ti=_TI(1, shared)))
        assert got == [mine["a"], {"stream": "b", "entries": 2}]
        assert "stream b: archived by this task" in caplog.text
        assert "stream a: archived by this task" not in caplog.text
    # a retry always runs its own job for the whole shard, whatever the shared job said
    ti = _TI(2, done)
    got = op.execute(_context(ti=ti))
    assert got == [{"stream": "a", "entries": 2}, {"stream": "b", "entries": 2}]
    assert ti.pulled == []
    # its own job fails for the streams: the task fails naming each with its error
    monkeypatch.setenv("SLUICE_TEST_X", "fail")
    with pytest.raises(Exception, match="archive failed for 2 of 2 stream.*'a': it broke"):
        op.execute(_context(ti=_TI(2, done)))


def test_the_shared_job_whose_every_stream_failed_fails_and_logs_each_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from pipeline.errors import LakeJobError

    monkeypatch.setenv("SLUICE_CONFIG", os.devnull)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, str(ROOT)]))
    monkeypatch.setenv("SLUICE_TEST_X", "fail")
    ops = _operators()
    op = ops.ArchiveStreamsOperator(
        task_id="archive_streams", streams=["a", "b"], module="job_child"
    )
    caplog.set_level("INFO")
    with pytest.raises(LakeJobError, match=r"every stream of the job failed \(2\): a, b"):
        op.execute(_context())
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert [m.split(":")[0] for m in errors if m.startswith("stream ")] == [
        "stream a failed",
        "stream b failed",
    ], errors
    # killed before the job started: none starts
    op.on_kill()
    with pytest.raises(Exception, match="stopped"):
        op.execute(_context())
