"""One ``Settings`` object, nested per part, read from ``SLUICE_*`` variables and ``sluice.toml``.

``settings.redis``, ``settings.lake``, ``settings.spark``, ``settings.node``,
``settings.bus`` and ``settings.serve`` are frozen sections; ``var_dir``,
``max_payload`` and ``log_level`` sit at the top. Every setting also has one
flat name, the one users write: section field ``bus.twin`` is ``bus_twin``,
read from ``SLUICE_BUS_TWIN`` or ``bus_twin = 1`` under ``[sluice]`` (or
``twin = 1`` under ``[sluice.bus]``). A few lake fields keep their historic
prefix-free names (``streams``, ``archive_cron``, ``hot_retention_s``...), and
``node`` holds the stream service's ``consumer_max_failures`` and
``lease_ttl_s``.

Precedence, highest first: explicit keyword arguments, environment variables,
``sluice.toml`` (path in ``SLUICE_CONFIG``, default ``./sluice.toml`` if
present), then the embedded defaults below. The defaults run everything on one
machine: a private ``redis-server``, Spark ``local[*]``, Airflow on SQLite, the
lake under ``./var/``.

Values are coerced by each field's declared type and every section checks
every one of its fields when built (``__post_init__``: type, range, relation
between fields), so a ``Settings`` that exists is valid however it was made
(``load``, ``replace``, the constructor). Every bad value raises
:class:`~pipeline.errors.ConfigError`, one line naming the flat setting, and
the environment variable or file it came from when ``load`` read it there.

The modules: ``fields`` (field kinds, the shared checks, the errors), one per
section (``redis``, ``lake``, ``spark``, ``node``, ``bus``, ``serve``),
``top`` (``Settings`` and ``load``), ``sources`` (the environment and the
file), ``coerce`` (text to a field's type) and ``build`` (values applied).
"""

from __future__ import annotations

from pipeline.settings.bus import BusSettings
from pipeline.settings.fields import Listen as Listen
from pipeline.settings.fields import Port as Port
from pipeline.settings.lake import OBJECT_STORE_SCHEMES as OBJECT_STORE_SCHEMES
from pipeline.settings.lake import LakeSettings
from pipeline.settings.node import NodeSettings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.serve import ServeSettings
from pipeline.settings.sources import NOT_SETTINGS as NOT_SETTINGS
from pipeline.settings.sources import NOT_SETTINGS_PREFIXES as NOT_SETTINGS_PREFIXES
from pipeline.settings.spark import SparkSettings
from pipeline.settings.top import LOG_LEVELS as LOG_LEVELS
from pipeline.settings.top import MAX_PAYLOAD, Settings, flat_names

__all__ = [
    "MAX_PAYLOAD",
    "BusSettings",
    "LakeSettings",
    "NodeSettings",
    "RedisSettings",
    "ServeSettings",
    "Settings",
    "SparkSettings",
    "flat_names",
]
