"""What Sluice's DAGs and plugins cost every task process: Airflow's task runner parses the
task's DAG file and runs every module of the plugins folder (for their macros), once per
task instance. A 100-stream run has 100 mapped ``archive`` tasks, so neither may pull in
FastAPI (the coverage app, which only the API server mounts) nor redis-py (the hook's
connection test): together they cost each task process ~0.3 CPU-s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: A task process's imports: the worker's modules, then the plugins as the task runner
#: loads them, then the DAG file; prints the heavy modules it found loaded.
TASK = """
import json, sys
import airflow.sdk.execution_time.task_runner
from airflow.sdk.plugins_manager import _get_plugins, integrate_macros_plugins
integrate_macros_plugins()
names = [p.name for p in _get_plugins()[0]]
sys.path[:0] = [{plugins!r}, {dags!r}]
import sluice_archive
heavy = sorted(m for m in ("fastapi", "starlette", "redis") if m in sys.modules)
print(json.dumps({{"plugins": names, "heavy": heavy}}))
"""


def test_a_task_process_loads_no_fastapi_or_redis(airflow_home: Path) -> None:
    env = {
        **os.environ,
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    }
    code = TASK.format(plugins=str(ROOT / "plugins"), dags=str(ROOT / "dags"))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "sluice_coverage" in found["plugins"], found  # the plugin is still registered
    assert found["heavy"] == [], found


def test_the_api_server_still_gets_the_coverage_app() -> None:
    """The app is built when the plugin's ``fastapi_apps`` is read, once per process."""
    import sluice_coverage
    from fastapi import FastAPI

    plugin = sluice_coverage.SluiceCoveragePlugin()
    (entry,) = plugin.fastapi_apps
    assert isinstance(entry["app"], FastAPI) and entry["url_prefix"] == "/sluice"
    assert plugin.fastapi_apps[0]["app"] is entry["app"]
