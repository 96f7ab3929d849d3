"""The Airflow pool Sluice's archive work runs in, created whenever a scheduler starts.

Why a pool: an archive run is many task instances (each stream's result, the
shared job, canonical marking, trim), and Airflow queues the highest
``priority_weight`` first: left in ``default_pool`` they filled every executor
slot while the schedule ran, and a ``sluice_replay``, ``sluice_audit`` or
``sluice_maintenance`` triggered by hand stayed "scheduled". Every task of
``sluice_archive`` (scheduled, manual and backfill runs alike) runs in
:data:`ARCHIVE_POOL`, whose slots are fewer than the executor's, so the other
DAGs always find a free slot.

Inside the pool, what a person asked for goes first, then the schedule, then a
backfill: :class:`RunKindPriority` (the DAG's ``weight_rule``) adds a bonus to
Airflow's own ``downstream`` weight by the kind of run, read from its run id,
so a backfill of many intervals takes what the scheduled and manual runs leave
(it used to win every tie: Airflow breaks them by the older logical date) and
a manual run (no logical date: it lost every tie) does not wait behind the
schedule's tasks.

Theory of operation: a plugin listener's ``on_starting`` hook runs in every
Airflow process that starts a job (the scheduler, the DAG processor, the
triggerer), before it schedules anything; there it creates the pool when it
does not exist, with :func:`archive_pool_slots` of ``[core] parallelism``
slots, and leaves an existing pool as it is (an operator's
``airflow pools set sluice_archive N ...`` stays). A task instance of a pool
that does not exist is never scheduled, so a fresh deployment must not depend
on a manual step. Task processes (``on_starting`` with the task runner) do
nothing here. docs/operations/airflow.md says how to size it.
"""

from __future__ import annotations

import logging
from typing import Any

import pluggy
import sluice_airflow_internals as internals
from airflow.plugins_manager import AirflowPlugin

log = logging.getLogger(__name__)

#: The pool every task of ``sluice_archive`` runs in.
ARCHIVE_POOL = "sluice_archive"
#: What the pool's description says (Airflow's Admin -> Pools shows it).
DESCRIPTION = (
    "Sluice's archive work (every task of sluice_archive); created by the sluice_pools plugin "
    "with the executor's parallelism less a quarter, so other DAGs always find a slot. "
    "Resize it with `airflow pools set`: it is never changed once it exists."
)

# Airflow's listener hooks are pluggy hooks of the project "airflow"; the marker is
# pluggy's (Airflow's own, airflow.listeners.hookimpl, is this very marker).
hookimpl = pluggy.HookimplMarker("airflow")


def archive_pool_slots(parallelism: int) -> int:
    """The slots :data:`ARCHIVE_POOL` is created with: the executor's ``parallelism``
    less a quarter of it (at least one slot) kept for the other DAGs; never below one."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    return max(1, parallelism - max(1, parallelism // 4))


def ensure_archive_pool() -> None:
    """Create :data:`ARCHIVE_POOL` unless it exists (see the module docstring)."""
    parallelism = internals.executor_parallelism()
    slots = archive_pool_slots(parallelism)
    existing = internals.ensure_pool(ARCHIVE_POOL, slots, DESCRIPTION)
    if existing is None:
        log.info(
            "created the pool %s with %d slots (parallelism %d)", ARCHIVE_POOL, slots, parallelism
        )
    elif existing >= parallelism > 1:
        log.warning(
            "pool %s has %d slots, the executor %d: archive runs can take every slot and "
            "starve the other DAGs (airflow pools set %s %d ...)",
            ARCHIVE_POOL, existing, parallelism, ARCHIVE_POOL, slots,
        )  # fmt: skip


#: The DAG's ``weight_rule``: the strategy below, by the name Airflow registers it under.
WEIGHT_RULE = "sluice_pools.RunKindPriority"
#: The bonus of each kind of run (by its run id's prefix; anything else is a manual run).
KIND_BONUS = {"backfill__": 0, "scheduled__": 100_000}
MANUAL_BONUS = 200_000


def run_bonus(run_id: str) -> int:
    """The weight a task instance of run ``run_id`` gets on top of Airflow's own."""
    return next((b for prefix, b in KIND_BONUS.items() if run_id.startswith(prefix)), MANUAL_BONUS)


class RunKindPriority(internals.priority_strategy_base()):  # type: ignore[misc]
    """Airflow's ``downstream`` weight plus :func:`run_bonus` of the task instance's run."""

    def get_weight(self, ti: Any) -> int:
        return internals.downstream_weight(ti) + run_bonus(str(ti.run_id or ""))


class _PoolListener:
    """Creates the pool when an Airflow job (scheduler, DAG processor, triggerer) starts."""

    @hookimpl
    def on_starting(self, component: Any) -> None:
        # airflow.jobs.job.Job; the task runner passes its own marker (no database there)
        if type(component).__name__ == "Job":
            ensure_archive_pool()


class SluicePoolsPlugin(AirflowPlugin):
    """Registers :class:`_PoolListener` and :class:`RunKindPriority`."""

    name = "sluice_pools"
    listeners = [_PoolListener()]
    priority_weight_strategies = [RunKindPriority]
