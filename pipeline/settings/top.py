"""The top ``Settings``: one section per part, the process-wide settings, and how they are loaded."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.settings.build import build, flat_index
from pipeline.settings.bus import BusSettings
from pipeline.settings.fields import NonEmpty, PositiveInt, check, invalid, read_from
from pipeline.settings.lake import LakeSettings
from pipeline.settings.node import NodeSettings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.serve import ServeSettings
from pipeline.settings.sources import gather
from pipeline.settings.spark import SparkSettings

#: Default of ``max_payload``: largest routed message / frame / stream payload, in bytes.
MAX_PAYLOAD = 1 << 20

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every setting of Sluice, one section per part. See :mod:`pipeline.settings` for names."""

    _SECTION: ClassVar[str] = ""

    redis: RedisSettings = field(default_factory=RedisSettings)
    lake: LakeSettings = field(default_factory=LakeSettings)
    spark: SparkSettings = field(default_factory=SparkSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    bus: BusSettings = field(default_factory=BusSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    var_dir: NonEmpty = "./var"
    #: Largest routed message / frame / stream payload accepted, in bytes.
    max_payload: PositiveInt = MAX_PAYLOAD
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        check(self)
        if self.log_level.upper() not in LOG_LEVELS:
            raise invalid(
                self,
                "log_level",
                f"must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}",
            )

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        *,
        parts: Collection[str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Build settings from ``sluice.toml``, then ``SLUICE_*``, then ``overrides``.

        ``overrides`` take flat names (``redis_url=...``, ``bus_twin=...``).
        ``parts`` (section names, e.g. ``("redis", "bus")``): read only those
        sections from the file and the environment, the others keep their
        defaults, so a bad value of a part a command does not use cannot stop
        it. Unknown names are refused either way, from the file or from a
        ``SLUICE_*`` variable alike; a config file named in ``SLUICE_CONFIG``
        must exist.
        """
        env = os.environ if env is None else env
        values, sources = gather(env, config_path, flat_index(cls), parts)
        for name, value in overrides.items():
            values[name] = value
            sources.pop(name, None)
        with read_from(sources):
            return build(cls(), values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied: flat names (``serve_port=0``) or whole sections."""
        return build(self, changes)


def flat_names() -> tuple[str, ...]:
    """Every flat setting name (``SLUICE_`` + its upper case is the environment variable)."""
    return tuple(flat_index(Settings))
