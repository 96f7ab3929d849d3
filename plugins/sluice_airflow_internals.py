"""The one place Sluice's plugins use Airflow beyond its public interface.

Airflow's public interface for plugins is ``airflow.sdk``, ``AirflowPlugin``
and the timetables; the coverage view needs three things that are not in it:
the metadata database's DAG runs and XComs (``airflow.models``,
``airflow.utils.session``), the UI's base URL (``airflow.configuration``) and
the core API's own access check (``airflow.api_fastapi``); the pools plugin needs
the pool table, ``[core] parallelism`` and the (experimental) priority weight
strategy interface (``airflow.task.priority_strategy``); the Celery plugin
needs the Celery provider's default configuration. They are behind the
functions here, which take and return plain values, so an Airflow upgrade
that moves them breaks this module alone, and
``tests/integration/airflow_view/test_airflow_internals.py`` checks each
against the pinned Airflow. Airflow's modules are imported inside the
functions: every Airflow process imports the plugins, and only the API server
calls these (importing the API modules costs seconds and tens of MB).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = [
    "DagRunRow",
    "authorize_dag_runs",
    "celery_default_config",
    "db_errors",
    "downstream_weight",
    "ensure_pool",
    "executor_parallelism",
    "priority_strategy_base",
    "read_runs",
    "ui_base_url",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DagRunRow:
    """One DAG run as the metadata database has it, and one XCom of it (``None``: absent)."""

    run_id: str
    state: str | None
    run_type: str | None
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    xcom: Any = None


def read_runs(dag_id: str, newest: int, named: Iterable[str], xcom_task: str) -> list[DagRunRow]:
    """The newest ``newest`` runs of ``dag_id`` plus those ``named``, each with the
    unmapped ``return_value`` XCom of task ``xcom_task`` as stored (JSON, maybe a string).

    Blocking (the metadata database): call it in a worker thread. Raises one of
    :func:`db_errors` when the database cannot be read.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    wanted = sorted(set(named))
    with create_session() as session:
        found = list(
            session.scalars(
                select(DagRun)
                .where(DagRun.dag_id == dag_id)
                .order_by(DagRun.id.desc())
                .limit(newest)
            ).all()
        )
        if wanted:
            found += session.scalars(
                select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id.in_(wanted))
            ).all()
        ids = list({r.run_id for r in found})
        xcoms: dict[str, Any] = dict(
            session.execute(
                select(XComModel.run_id, XComModel.value).where(
                    XComModel.dag_id == dag_id,
                    XComModel.task_id == xcom_task,
                    XComModel.key == "return_value",
                    XComModel.map_index == -1,
                    XComModel.run_id.in_(ids),
                )
            ).all()
        )
        return [
            DagRunRow(
                run_id=r.run_id,
                state=str(r.state) if r.state is not None else None,
                run_type=str(r.run_type) if r.run_type is not None else None,
                data_interval_start=r.data_interval_start,
                data_interval_end=r.data_interval_end,
                xcom=xcoms.get(r.run_id),
            )
            for r in found
        ]


def db_errors() -> tuple[type[BaseException], ...]:
    """What :func:`read_runs` raises when the metadata database cannot be read."""
    from sqlalchemy.exc import SQLAlchemyError

    return (SQLAlchemyError,)


def ui_base_url() -> str:
    """Airflow's ``[api] base_url`` (``/`` when unset)."""
    from airflow.configuration import conf

    return str(conf.get("api", "base_url", fallback="/") or "/")


async def authorize_dag_runs(request: Any, credentials: Any, dag_id: str) -> None:
    """What ``GET /api/v2/dags/{dag_id}/dagRuns`` requires, checked by Airflow's own code:
    the caller Airflow's core API would see (``credentials``: a bearer token, else the
    UI's ``_token`` cookie) and the auth manager's read permission on the DAG's runs.
    Raises FastAPI's ``HTTPException`` (401/403) as the core API does.
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user, requires_access_dag

    user = await get_user(request, None, credentials)
    check = requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=dag_id)
    # Blocking (the DAG's team comes from the metadata DB): as the core API, in a thread.
    await asyncio.to_thread(check, request, user)


def executor_parallelism() -> int:
    """Airflow's ``[core] parallelism``: the most task instances its executors run at once."""
    from airflow.configuration import conf

    return conf.getint("core", "parallelism")


def ensure_pool(name: str, slots: int, description: str) -> int | None:
    """Create the pool ``name`` with ``slots`` unless it exists: None when created, else the
    existing pool's slots (left as they are). Safe to race with another process doing the
    same. Blocking (the metadata database); raises one of :func:`db_errors` when it fails.
    """
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session
    from sqlalchemy import select
    from sqlalchemy.exc import IntegrityError

    for _ in range(2):
        try:
            with create_session() as session:
                found = session.scalar(select(Pool).where(Pool.pool == name))
                if found is not None:
                    return int(found.slots)
                session.add(
                    Pool(pool=name, slots=slots, description=description, include_deferred=False)
                )
            return None
        except IntegrityError:  # another process created it first: read it again
            continue
    raise RuntimeError(f"pool {name!r} could not be created nor read")


def priority_strategy_base() -> type[Any]:
    """Airflow's ``PriorityWeightStrategy``: the base class of a plugin's weight strategy
    (a subclass implements ``get_weight(ti) -> int``)."""
    from airflow.task.priority_strategy import PriorityWeightStrategy

    return PriorityWeightStrategy


def downstream_weight(ti: Any) -> int:
    """The weight Airflow's default rule (``downstream``) gives task instance ``ti``."""
    from airflow.task.priority_strategy import validate_and_load_priority_weight_strategy

    return int(validate_and_load_priority_weight_strategy("downstream").get_weight(ti))


def celery_default_config() -> Any:
    """The Celery provider's default Celery configuration (what ``[celery]
    celery_config_options`` names when it is not set)."""
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    return DEFAULT_CELERY_CONFIG
