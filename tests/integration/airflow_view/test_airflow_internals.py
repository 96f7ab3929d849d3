"""The contract of plugins/sluice_airflow_internals.py with the pinned Airflow.

The DAGs and plugins use Airflow's public interface (``airflow.sdk``,
``AirflowPlugin``, the timetables) everywhere but in that one adapter; the
adapter's uses of Airflow's internals are checked here against the Airflow
installed, which must be the version constraints.txt pins (inside pyproject.toml's
range): an upgrade that moves one of them fails here, not in a user's API server.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ROOT / "plugins"
ADAPTER = "sluice_airflow_internals"
#: Airflow's public interface for DAG and plugin authors.
PUBLIC = ("airflow.sdk", "airflow.plugins_manager", "airflow.timetables")


def _airflow_imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name == "airflow" or name.startswith("airflow."):
                yield node.lineno, name


def test_only_the_adapter_reaches_past_airflows_public_interface() -> None:
    files = [*sorted((ROOT / "dags").glob("*.py")), *sorted(PLUGINS.glob("*.py"))]
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        if path.stem != ADAPTER
        for line, name in _airflow_imports(path)
        if not name.startswith(PUBLIC)
    ]
    assert outside == []
    internal = {name for _, name in _airflow_imports(PLUGINS / f"{ADAPTER}.py")}
    assert internal and not any(name.startswith(PUBLIC) for name in internal)


def test_the_installed_airflow_is_the_pinned_one() -> None:
    # (metadata, not an import: importing Airflow before the airflow_home fixture
    # would fix its configuration for the whole session)
    pins = re.findall(r"^apache-airflow==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pins == [importlib.metadata.version("apache-airflow")]


@pytest.fixture
def adapter(airflow_home: Path) -> ModuleType:
    if str(PLUGINS) not in sys.path:  # Airflow adds it in its own processes
        sys.path.append(str(PLUGINS))
    import sluice_airflow_internals

    return sluice_airflow_internals


def test_the_run_query_runs_on_the_migrated_metadata_database(adapter: ModuleType) -> None:
    """The real SQL against a real (empty) Airflow schema: every column it names exists.
    (tests/integration/airflow_view/test_coverage_view.py reads real runs and XComs
    through it in Airflow's API server.)"""
    # a DAG no test runs: the session's database may hold other tests' runs of the real ones
    assert adapter.read_runs("sluice_contract_absent", 5, ["absent"], xcom_task="streams") == []
    [error] = adapter.db_errors()
    from sqlalchemy.exc import OperationalError

    assert issubclass(OperationalError, error)
    assert adapter.ui_base_url().startswith(("/", "http"))
    # the Celery plugin's configuration: the provider's own, a mapping Celery reads
    assert "broker_url" in adapter.celery_default_config()


# Airflow's API modules import starlette's test client, which warns about httpx (a library's
# warning at import, not ours)
@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated")
def test_the_access_check_is_called_as_airflow_defines_it(adapter: ModuleType) -> None:
    """What authorize_dag_runs calls, with the arguments it passes (the view's end-to-end
    tests check 401/403/200 through Airflow's API server)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user, requires_access_dag

    assert inspect.iscoroutinefunction(get_user)
    assert len(inspect.signature(get_user).parameters) == 3  # request, oauth token, bearer
    params = inspect.signature(requires_access_dag).parameters
    assert list(params)[:3] == ["method", "access_entity", "param_dag_id"]
    check = requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id="sluice_archive")
    assert len(inspect.signature(check).parameters) == 2  # request, user
