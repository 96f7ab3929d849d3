"""Where Sluice's Airflow DAGs and plugins are: point Airflow's folders here.

``AIRFLOW__CORE__DAGS_FOLDER=$(python -c 'from pipeline import airflow_folder;
print(airflow_folder("dags"))')``, and the same for ``plugins``. Installed from a wheel they
are in the package (``pipeline/airflow_folders/``, copied by the build); in a checkout
(an editable install) they are the checkout's ``dags/`` and ``plugins/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pipeline.errors import ConfigError

__all__ = ["airflow_folder"]

_HERE = Path(__file__).resolve().parent


def airflow_folder(name: Literal["dags", "plugins"]) -> Path:
    """The directory of Sluice's Airflow ``dags`` or ``plugins``; ConfigError if absent."""
    for candidate in (_HERE / "airflow_folders" / name, _HERE.parent / name):
        if any(candidate.glob("sluice_*.py")):
            return candidate
    raise ConfigError(f"Sluice's Airflow {name} folder is not installed with {_HERE}")
