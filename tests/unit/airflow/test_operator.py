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


class _Steps:
    """A LakeJobOperator whose catch-up steps are given (no lake to read)."""

    @staticmethod
    def make(steps: list[tuple[int, int]]) -> object:
        sys.path.insert(0, PLUGINS)
        sys.path.insert(0, HERE)
        from sluice_lake_operator import LakeJobOperator

        class Op(LakeJobOperator):
            def steps(self, context: object, settings: object) -> list[tuple[int, int]]:
                return steps

        return Op(task_id="archive", job="ok", stream="s", interval=True, module="job_child")


def test_catch_up_runs_one_job_per_step_and_reports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import UTC, datetime

    monkeypatch.setenv("SLUICE_CONFIG", os.devnull)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, str(ROOT)]))
    op: Any = _Steps.make([(100, 200), (200, 300), (300, 400)])
    context = {
        "data_interval_start": datetime.fromtimestamp(0.3, UTC),
        "data_interval_end": datetime.fromtimestamp(0.4, UTC),
        "run_id": "r1",
    }
    result = op.execute(context)
    # the last job archived the run's own interval; two earlier steps are reported
    assert result["args"][:6] == ["--stream", "s", "--start-ms", "300", "--end-ms", "400"]
    assert len(result["caught_up"]) == 2 and result["warnings"] == 0
    # killed between two steps: no further job starts
    op.on_kill()
    with pytest.raises(Exception, match="stopped"):
        op.execute(context)


def test_backfill_runs_archive_only_their_own_interval() -> None:
    from types import SimpleNamespace

    sys.path.insert(0, PLUGINS)
    from airflow.utils.types import DagRunType
    from sluice_lake_operator import LakeJobOperator

    op = LakeJobOperator(task_id="archive", job="archive", stream="s", interval=True, catchup=True)
    context = {"dag_run": SimpleNamespace(run_type=DagRunType.BACKFILL_JOB)}
    assert op.steps(context, settings=None) is None  # never reads the lake
