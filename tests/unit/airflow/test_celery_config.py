"""``sluice_celery``: in a Celery worker, the children it forks (and theirs) die with their
parent; elsewhere nothing changes. Real forks in a child interpreter: a middle process
forks a grandchild and exits; the grandchild must be gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import sluice_celery

PLUGINS = str(Path(__file__).resolve().parents[3] / "plugins")

#: argv as given, then: fork a middle process that forks a grandchild (which sleeps) and
#: exits; report whether the grandchild is still alive a moment later (then end it).
ORPHAN = """
import json, os, signal, sys, time
sys.argv = {argv!r}
sys.path.insert(0, {plugins!r})
import sluice_celery
read, write = os.pipe()
middle = os.fork()
if middle == 0:
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(30)
        os._exit(0)
    os.write(write, str(grandchild).encode())
    os._exit(0)
os.waitpid(middle, 0)
grandchild = int(os.read(read, 32))
alive = True
for _ in range(50):
    try:
        with open(f"/proc/{{grandchild}}/stat") as stat:
            alive = stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        alive = False
    if not alive:
        break
    time.sleep(0.01)
if alive:
    os.kill(grandchild, signal.SIGKILL)
print(json.dumps({{"alive": alive}}))
"""


def _orphan_alive(argv: list[str]) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", ORPHAN.format(argv=argv, plugins=PLUGINS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    alive: bool = json.loads(done.stdout.splitlines()[-1])["alive"]
    return alive


def test_a_celery_workers_grandchild_dies_with_its_parent() -> None:
    assert not _orphan_alive(["airflow", "celery", "worker", "--concurrency", "1"])


def test_other_processes_keep_their_orphans() -> None:
    assert _orphan_alive(["airflow", "scheduler"])


def test_the_celery_config_is_the_providers_own() -> None:
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    assert sluice_celery.CELERY_CONFIG is DEFAULT_CELERY_CONFIG
    assert sluice_celery.is_celery_worker(["/venv/bin/airflow", "celery", "worker"])
    assert not sluice_celery.is_celery_worker(["/venv/bin/airflow", "celery", "flower"])
