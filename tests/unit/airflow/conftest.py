"""Make ``plugins/`` importable, as Airflow does in its own processes."""

from __future__ import annotations

import sys
from pathlib import Path

PLUGINS = str(Path(__file__).resolve().parents[3] / "plugins")
if PLUGINS not in sys.path:
    sys.path.append(PLUGINS)
