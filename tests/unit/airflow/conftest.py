"""Make ``plugins/`` importable, as Airflow does in its own processes; configure Airflow first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

PLUGINS = str(Path(__file__).resolve().parents[3] / "plugins")
if PLUGINS not in sys.path:
    sys.path.append(PLUGINS)


@pytest.fixture(autouse=True)
def _airflow_configured(airflow_home: Path) -> None:
    """Airflow reads its configuration once per process, at its first import: these tests
    import it in-process, so the session's AIRFLOW_HOME (and its database) must exist first,
    or the integration tests that run later in the same process find no tables."""
