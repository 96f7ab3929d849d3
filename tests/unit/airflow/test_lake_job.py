"""The lake-job runner against real child processes (tests/unit/airflow/job_child.py)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from sluice_lake_job import parse_result, run_lake_job

from pipeline.errors import LakeJobError

HERE = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": str(HERE), "SLUICE_TEST_X": "from-env"}


def run(*args: str, timeout_s: float = 60.0) -> object:
    return run_lake_job(args[0], list(args[1:]), env=ENV, timeout_s=timeout_s, module="job_child")


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_result_is_the_json_on_stdout_and_env_reaches_the_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="sluice_lake_job")
    assert run("ok", "--stream", "s") == {"job": "ok", "args": ["--stream", "s"], "env": "from-env"}
    # The child's stderr is in the task log, line by line.
    assert "| working on it" in caplog.text


def test_pretty_printed_json_is_accepted() -> None:
    assert run("pretty") == {"rows": [1, 2, 3]}


def test_failure_raises_with_the_job_error_message() -> None:
    with pytest.raises(
        LakeJobError, match="exit code 3: sluice lake: stream 'x' does not exist"
    ) as info:
        run("fail")
    assert info.value.returncode == 3
    assert "does not exist" in info.value.stderr_tail


def test_a_report_code_with_json_returns_the_report() -> None:
    codes = frozenset({1})
    result = run_lake_job(
        "report", [], env=ENV, timeout_s=60, module="job_child", report_codes=codes
    )
    assert result == {"ok": False, "gaps": [[3, 4]]}
    # Without a JSON result the same code is a failure; other codes always are.
    with pytest.raises(LakeJobError, match="exit code 3"):
        run_lake_job(
            "fail", [], env=ENV, timeout_s=60, module="job_child", report_codes=frozenset({3})
        )
    with pytest.raises(LakeJobError, match="exit code 1"):
        run_lake_job("report", [], env=ENV, timeout_s=60, module="job_child")


def test_stdout_that_is_not_json_is_an_error() -> None:
    with pytest.raises(LakeJobError, match="did not print a JSON result"):
        run("garbage")


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with pytest.raises(LakeJobError, match="exceeded its 3s limit"):
        run("hang", str(pids), timeout_s=3)
    child, grandchild = map(int, pids.read_text().split())
    assert _gone(child) and _gone(grandchild)


def test_a_leftover_grandchild_is_killed_after_the_job_exits(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    assert run("orphan", str(pid_file)) == {"done": True}
    assert _gone(int(pid_file.read_text()))


def test_a_missing_module_fails_clearly() -> None:
    with pytest.raises(LakeJobError, match="No module named"):
        run_lake_job("x", [], env=ENV, timeout_s=30, module="no_such_module_here")


def test_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        run_lake_job("x", [], timeout_s=0)


def test_parse_result_prefers_the_whole_stdout_then_the_last_line() -> None:
    assert parse_result("j", '{"a": 1}') == {"a": 1}
    assert parse_result("j", ':: ivy noise\n{"a": 2}\n') == {"a": 2}
    with pytest.raises(LakeJobError):
        parse_result("j", "")


def test_environment_is_not_leaked_back() -> None:
    run("ok")
    assert os.environ.get("SLUICE_TEST_X") is None


def test_the_job_dies_with_a_killed_task_process(tmp_path: Path) -> None:
    """SIGKILL of the task process (no finally runs): Linux's parent-death signal stops the job."""
    import signal
    import subprocess
    import sys

    pids = tmp_path / "pids"
    plugins = str(Path(__file__).resolve().parents[3] / "plugins")
    code = (
        f"import sys; sys.path.insert(0, {plugins!r});"
        "from sluice_lake_job import run_lake_job;"
        f"run_lake_job('hang', [{str(pids)!r}], env={ENV!r}, timeout_s=120, module='job_child')"
    )
    task = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and len(pids.read_text().split()) == 2):
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        child, grandchild = map(int, pids.read_text().split())
        task.kill()
        task.wait(timeout=10)
        assert _gone(child)
    finally:
        if task.poll() is None:
            task.kill()
            task.wait(timeout=10)
        # A bare sleep has no way to notice (a Spark JVM exits on its gateway's EOF).
        for pid in map(int, pids.read_text().split()) if pids.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert grandchild > 0
