"""Sluice's Celery configuration: a Celery worker's processes die with the process that forked them.

Set ``AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=sluice_celery.CELERY_CONFIG`` on every
machine (docs/operations/celery.md). :data:`CELERY_CONFIG` is the provider's own
configuration, unchanged; what the import adds is the reason to set it.

Why: ``airflow celery worker`` forks its log server (``serve-logs``, a port) and
Celery's pool children, and each pool child forks a task runner per task (in a process
group of its own). Celery arms ``PR_SET_PDEATHSIG`` in its pool children only. A worker
killed with SIGKILL (the OOM killer, ``kill -9``) left its ``serve-logs`` holding its
port (a restarted worker could not serve logs) and each running task's runner alive
beside the task's retry on another worker, with the lake job it started.

Theory of operation: the provider imports this module (the ``celery_config_options``
setting) at start, before the worker forks anything. When the process is a Celery worker
(``airflow celery worker``), an ``os.register_at_fork`` hook arms ``PR_SET_PDEATHSIG``
(SIGKILL) in every child it forks, and the hook is inherited: the pool children's task
runners get it too. A child whose parent died before the signal was armed kills itself.
Helpers started with ``[celery] mp_start_method`` ``spawn`` (not the default ``fork``)
are not covered.
Lake jobs are started with ``subprocess`` (no fork hooks run) and have their own
parent-death signal (``sluice_lake_job``). Elsewhere (the scheduler imports this module
too, and the task runner imports every plugin module) the import does nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import Any

__all__ = ["arm_children", "is_celery_worker"]

_PR_SET_PDEATHSIG = 1
#: The pid of the process that last forked (read in the child, which inherits it).
_forker = [0]
_armed = [False]


def is_celery_worker(argv: list[str]) -> bool:
    """Whether ``argv`` is ``airflow celery worker ...`` (a forked child keeps its parent's)."""
    return argv[1:3] == ["celery", "worker"]


def arm_children() -> None:
    """From now on, every child this process (or a child of it) forks gets SIGKILL when the
    thread that forked it ends. Idempotent; Linux only (elsewhere nothing happens)."""
    if _armed[0] or not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return

    def before() -> None:
        _forker[0] = os.getpid()

    def in_child() -> None:
        with contextlib.suppress(OSError):
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != _forker[0]:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    os.register_at_fork(before=before, after_in_child=in_child)
    _armed[0] = True


def __getattr__(name: str) -> Any:
    """``CELERY_CONFIG``, what ``[celery] celery_config_options`` names: the provider's own
    defaults, as they are (read when asked for: every task runner imports this module)."""
    if name == "CELERY_CONFIG":
        import sluice_airflow_internals  # (Airflow puts the plugins folder on the path)

        return sluice_airflow_internals.celery_default_config()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if is_celery_worker(sys.argv):
    arm_children()
