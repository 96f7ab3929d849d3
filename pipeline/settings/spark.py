"""The ``spark`` section: how lake jobs reach Spark."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlparse

from pipeline.settings.fields import NonEmpty, Port, PositiveInt, check, invalid

#: A JVM memory size as Spark reads it: ``512m``, ``1g``, ``2gb``...
MEMORY = re.compile(r"\d+([kmgtp]b?|b)?", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class SparkSettings:
    """How lake jobs reach Spark."""

    _SECTION: ClassVar[str] = "spark"

    master: NonEmpty = "local[*]"
    #: ``sc://host:port`` of a Spark Connect server: lake jobs become thin clients ("" = local JVM).
    remote: str = ""
    #: Comma-separated Delta jar paths for the local one-JVM mode ("" = the cache ``make install`` wrote).
    jars: str = ""
    #: Heap of a local Spark driver (one-JVM mode and ``sluice spark``).
    driver_memory: str = "1g"
    #: Port ``sluice spark`` listens on.
    connect_port: Port = 15002
    shuffle_partitions: PositiveInt = 4
    #: Seconds a shared archive job waits for a lost Spark Connect server to listen again
    #: before the streams it had not finished fail (0: fail at once).
    reconnect_s: float = 300.0

    def __post_init__(self) -> None:
        check(self)
        if self.remote:
            parsed = urlparse(self.remote)
            if parsed.scheme != "sc" or not parsed.hostname:
                raise invalid(self, "remote", f"must be sc://host[:port], got {self.remote!r}")
        if not MEMORY.fullmatch(self.driver_memory):
            raise invalid(
                self,
                "driver_memory",
                f"must be a JVM memory size (512m, 1g...), got {self.driver_memory!r}",
            )
