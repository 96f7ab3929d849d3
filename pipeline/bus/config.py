"""Tunables of a bus process, and the error handling its loops share."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import redis.exceptions

from pipeline.settings import Settings

#: What a Redis call may raise when Redis is away; loops retry after these.
REDIS_ERRORS = (redis.exceptions.RedisError, OSError)


@dataclass(frozen=True, slots=True, kw_only=True)
class BusConfig:
    """Tunables of one bus process (the twin-facing ones come from :class:`Settings`)."""

    twin: int
    host: str = "127.0.0.1"
    port: int = 8051
    legacy_peers: bool = False
    default_exp: int = 300
    max_exp: int = 86400
    max_try: int = 16
    retry_base_s: float = 0.1
    retry_max_s: float = 2.0
    max_size: int = 1 << 20
    batch: int = 256
    scrub_interval_s: float = 0.25
    http_workers: int = 128
    max_pending: int = 10_000
    redis_connections: int = 32
    #: Seconds a signed POST's timestamp may differ from this bus's clock.
    replay_window_s: float = 300.0
    #: Most request ids remembered for replay protection (then peers get 503 and retry).
    max_seen: int = 2_000_000
    #: Handling attempts of one message before it goes to the dead-letter list.
    max_attempts: int = 3
    #: Seconds an inbound HTTP connection may go without completing a request.
    http_idle_s: float = 30.0
    #: Inbound HTTP connections open at once (more are closed on arrival).
    http_max_connections: int = 1024

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: object) -> BusConfig:
        host, _, port = settings.bus_listen.rpartition(":")
        values: dict[str, object] = {
            "twin": settings.bus_twin,
            "host": host or "127.0.0.1",
            "port": int(port),
            "legacy_peers": settings.bus_legacy_peers,
            "default_exp": settings.bus_default_exp_s,
            "max_exp": settings.bus_max_exp_s,
            "max_try": settings.bus_max_try,
            "retry_base_s": settings.bus_retry_base_s,
            "retry_max_s": settings.bus_retry_max_s,
            "max_size": settings.max_payload,
            "replay_window_s": settings.bus_replay_window_s,
            "max_seen": settings.bus_max_seen,
            "max_attempts": settings.bus_max_attempts,
            "http_idle_s": settings.bus_http_idle_s,
            "http_max_connections": settings.bus_http_max_connections,
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def reraise_if_cancelling(exc: BaseException) -> None:
    """redis-py may turn a cancellation into a connection error: never swallow a cancel."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
