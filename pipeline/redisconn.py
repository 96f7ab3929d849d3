"""Every Redis client of Sluice is built here, one place for pools, timeouts, TLS and retries.

``connect(url, role)`` returns an asyncio client, ``connect_sync(url, role)``
a blocking one. The ``role`` picks the bounds:

- every pool is a ``BlockingConnectionPool`` of a fixed size: a burst waits
  for a free connection (up to ``pool_wait_s``) instead of opening sockets
  without limit;
- ``socket_timeout`` is longer than any blocking wait the role issues
  (``XREAD BLOCK``, ``BLPOP``): redis-py 8 sets 5 s by default, which would
  turn a 7 s wait into a ``TimeoutError``. Callers that block for longer pass
  ``block_s`` and get ``block_s + margin``. One role has none
  (``Role.STREAM_HOT``): each of its commands runs under its caller's own
  deadline, which is cheaper than redis-py's per-command ``wait_for``;
- ``rediss://`` URLs keep TLS (redis-py reads the scheme), ``redis://`` do not;
- a dropped connection is retried a few times with backoff for roles whose
  commands are safe to repeat (reads, idempotent writes).

Background tailers (the server's live tail) get a pool of their own
(``Role.TAIL``) so that a burst of client requests can never starve them.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from pipeline.errors import ConfigError


class Role(enum.Enum):
    """What a client is for; each role has its own bounds (see :data:`BOUNDS`)."""

    CLI = "cli"
    PRODUCER = "producer"
    STREAM_SERVICE = "stream_service"
    #: The stream service's commands for clients on its own node, each run under that
    #: client's call deadline (:mod:`pipeline.streams.client`), so with no socket timeout.
    STREAM_HOT = "stream_hot"
    BUS = "bus"
    BUS_CLIENT = "bus_client"
    SERVE = "serve"
    TAIL = "tail"
    LAKE = "lake"


@dataclass(frozen=True, slots=True)
class Bounds:
    max_connections: int
    #: Longest single command without a blocking wait, in seconds. None: no socket
    #: timeout, for a role whose every command runs under its caller's own deadline.
    #: Why have such a role: with a socket timeout redis-py sends each command through
    #: ``asyncio.wait_for``, a task per command (a GET costs 50 us of CPU instead of
    #: 31 us here; ``rtt_p50_ms`` of ``make bench B=streams``).
    socket_timeout_s: float | None
    connect_timeout_s: float = 5.0
    #: How long a caller waits for a free pooled connection.
    pool_wait_s: float = 10.0
    #: Retries of a command whose connection dropped (0: none).
    retries: int = 3


BOUNDS: dict[Role, Bounds] = {
    Role.CLI: Bounds(max_connections=4, socket_timeout_s=30.0),
    Role.PRODUCER: Bounds(max_connections=8, socket_timeout_s=30.0),
    Role.STREAM_SERVICE: Bounds(max_connections=96, socket_timeout_s=30.0),
    Role.STREAM_HOT: Bounds(max_connections=64, socket_timeout_s=None),
    # A claim or release that ran twice would strand a batch in flight: no retries.
    Role.BUS: Bounds(max_connections=64, socket_timeout_s=30.0, retries=0),
    Role.BUS_CLIENT: Bounds(max_connections=64, socket_timeout_s=30.0),
    Role.SERVE: Bounds(max_connections=64, socket_timeout_s=30.0),
    Role.TAIL: Bounds(max_connections=4, socket_timeout_s=30.0),
    Role.LAKE: Bounds(max_connections=8, socket_timeout_s=60.0),
}

#: Added to the longest blocking wait a role issues to get its socket timeout.
BLOCK_MARGIN_S = 10.0


def _check_url(url: str) -> None:
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"not a redis URL (redis://, rediss:// or unix://): {url!r}")


def _kwargs(role: Role, block_s: float, max_connections: int | None) -> dict[str, Any]:
    bounds = BOUNDS[role]
    return {
        "max_connections": max_connections or bounds.max_connections,
        "timeout": bounds.pool_wait_s,
        "socket_timeout": (
            None
            if bounds.socket_timeout_s is None
            else max(bounds.socket_timeout_s, block_s + BLOCK_MARGIN_S)
        ),
        "socket_connect_timeout": bounds.connect_timeout_s,
        "retry_on_error": [RedisConnectionError] if bounds.retries else [],
        "health_check_interval": 30,
    }


def connect(
    url: str, role: Role, *, block_s: float = 0.0, max_connections: int | None = None
) -> aioredis.Redis:
    """An asyncio client for ``role``; ``block_s`` is the longest blocking wait it will issue."""
    _check_url(url)
    retries = BOUNDS[role].retries
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        retry=AsyncRetry(ExponentialBackoff(cap=0.5, base=0.05), retries),
        **_kwargs(role, block_s, max_connections),
    )
    return aioredis.Redis.from_pool(pool)


def connect_sync(
    url: str, role: Role, *, block_s: float = 0.0, max_connections: int | None = None
) -> redis.Redis:
    """A blocking client for ``role`` (lake jobs, CLI tools, Airflow tasks)."""
    _check_url(url)
    retries = BOUNDS[role].retries
    pool = redis.BlockingConnectionPool.from_url(
        url,
        retry=SyncRetry(ExponentialBackoff(cap=0.5, base=0.05), retries),
        **_kwargs(role, block_s, max_connections),
    )
    return redis.Redis.from_pool(pool)


#: What a lost or refused Redis connection raises, for callers that retry or report it.
UNAVAILABLE: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


def checkpoint(cause: BaseException | None = None) -> None:
    """Re-raise a cancellation that redis-py swallowed; call it after a Redis await.

    redis-py's asyncio client sometimes turns the ``CancelledError`` of a
    command cancelled mid-flight into a connection error, or eats it and
    returns normally; a task that then awaits something long would never end.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("cancelled during a redis command") from cause


def parse_entry_id(entry_id: bytes | str) -> tuple[int, int]:
    """A Redis stream entry id ``ms-seq`` as two integers; ``ValueError`` on anything else."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, sep, seq = text.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"not a stream entry id: {text!r}")
    return int(ms), int(seq)


__all__ = [
    "BLOCK_MARGIN_S",
    "BOUNDS",
    "UNAVAILABLE",
    "Bounds",
    "Role",
    "connect",
    "connect_sync",
    "parse_entry_id",
    "checkpoint",
]
