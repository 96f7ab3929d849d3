"""Tunables of a bus process, and the error handling its loops share."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, fields
from typing import Any

import redis.exceptions

from pipeline.errors import ConfigError
from pipeline.redisio.url import Topology, parse
from pipeline.settings import MAX_PAYLOAD, BusSettings, Settings

#: What a Redis call may raise when Redis is away; loops retry after these.
REDIS_ERRORS = (redis.exceptions.RedisError, OSError)


@dataclass(frozen=True, slots=True, kw_only=True)
class BusConfig(BusSettings):
    """One bus process: the ``bus`` section of :class:`Settings` (every default is there)
    plus the process-wide payload bound it shares with the other parts."""

    #: Largest envelope / POST body accepted (``max_payload``).
    max_size: int = field(default=MAX_PAYLOAD, metadata={"flat": "max_payload"})

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> BusConfig:
        values: dict[str, Any] = {
            f.name: getattr(settings.bus, f.name) for f in fields(BusSettings)
        }
        values["max_size"] = settings.max_payload
        values.update(overrides)
        return cls(**values)


#: Why the bus refuses a cluster URL (docs/DESIGN.md, "The bus on more than one Redis").
CLUSTER_REFUSAL = (
    "the bus runs on one Redis per twin (RMB clients push to fixed msgbus.* keys that a "
    "cluster spreads over six slots): use redis+sentinel://... for a bus that survives a "
    "master's loss, not redis+cluster://"
)


def bus_redis_url(url: str) -> str:
    """``url`` if the bus can run on it; :class:`ConfigError` (one line) for a cluster URL."""
    if parse(url).topology is Topology.CLUSTER:
        raise ConfigError(CLUSTER_REFUSAL)
    return url


def reraise_if_cancelling(exc: BaseException) -> None:
    """redis-py may turn a cancellation into a connection error: never swallow a cancel."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
