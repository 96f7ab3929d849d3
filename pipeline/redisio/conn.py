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
- ``redis+sentinel://`` URLs give a client of the master a Sentinel group names, whose
  pool asks the Sentinels for the master at each new connection (so it follows a
  failover), and ``redis+cluster://`` URLs a ``RedisCluster`` that follows MOVED/ASK
  (see :mod:`pipeline.redisio.url` for the forms, :mod:`pipeline.redisio.ha` for the clients);
- a dropped connection is retried a few times with backoff for roles whose
  commands are safe to repeat (reads, idempotent writes);
- a write on a connection the event loop has closed already (the server went away
  while it sat in the pool) is a ``ConnectionError`` on every event loop: uvloop's
  transports raise ``RuntimeError`` for it, which no caller's ``except RedisError``
  took (it ended the bus's loops: bus history seed 208, a Redis wiped under the bus).

Background tailers (the server's live tail) get a pool of their own
(``Role.TAIL``) so that a burst of client requests can never starve them.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from pipeline.redisio import ha as redisha
from pipeline.redisio.url import Topology, parse


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


def _transport_closed(exc: RuntimeError) -> bool:
    """uvloop's ``RuntimeError`` for an operation on a closed transport ("unable to perform
    operation on <TCPTransport closed=True ...>; the handler is closed")."""
    return "handler is closed" in str(exc) or "closed=True" in str(exc)


_LOST_CLASSES: dict[type[Any], type[Any]] = {}


def _lost_as_connection_error(base: type[Any]) -> type[Any]:
    """``base`` whose writes turn a closed transport's ``RuntimeError`` into a
    ``ConnectionError`` (so the pool's retry, and every caller's handling of a lost
    connection, take it). One subclass per base class, made once."""
    made = _LOST_CLASSES.get(base)
    if made is not None:
        return made

    async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        try:
            await base.send_packed_command(self, command, check_health)
        except RuntimeError as exc:
            if not _transport_closed(exc):
                raise
            raise RedisConnectionError(f"connection lost: {exc}") from exc

    made = type(base.__name__, (base,), {"send_packed_command": send_packed_command})
    _LOST_CLASSES[base] = made
    return made


def _pool_lost_as_connection_error(client: aioredis.Redis) -> aioredis.Redis:
    pool = client.connection_pool
    pool.connection_class = _lost_as_connection_error(pool.connection_class)
    return client


def connect(
    url: str, role: Role, *, block_s: float = 0.0, max_connections: int | None = None
) -> aioredis.Redis:
    """An asyncio client for ``role``; ``block_s`` is the longest blocking wait it will issue.

    For a ``redis+cluster://`` URL the client is a :class:`redis.asyncio.RedisCluster`
    (typed as ``Redis``: it has the same command methods; :func:`is_cluster` tells them
    apart where a part needs a single-server feature). ``ConfigError`` on a bad URL.
    """
    target = parse(url)
    retries = BOUNDS[role].retries
    retry = AsyncRetry(ExponentialBackoff(cap=0.5, base=0.05), retries)
    kwargs = _kwargs(role, block_s, max_connections)
    if target.topology is Topology.SENTINEL:
        return _pool_lost_as_connection_error(redisha.sentinel_async(target, retry, kwargs))
    if target.topology is Topology.CLUSTER:
        # redis-py's cluster nodes build plain Connections whatever they are given; no
        # uvloop process (the bus) runs on a cluster
        return cast(aioredis.Redis, redisha.cluster_async(target, retry, kwargs))
    pool = aioredis.BlockingConnectionPool.from_url(url, retry=retry, **kwargs)
    return _pool_lost_as_connection_error(aioredis.Redis.from_pool(pool))


def connect_sync(
    url: str, role: Role, *, block_s: float = 0.0, max_connections: int | None = None
) -> redis.Redis:
    """A blocking client for ``role`` (lake jobs, CLI tools, Airflow tasks); see :func:`connect`."""
    target = parse(url)
    retries = BOUNDS[role].retries
    retry = SyncRetry(ExponentialBackoff(cap=0.5, base=0.05), retries)
    kwargs = _kwargs(role, block_s, max_connections)
    if target.topology is Topology.SENTINEL:
        return redisha.sentinel_sync(target, retry, kwargs)
    if target.topology is Topology.CLUSTER:
        return cast(redis.Redis, redisha.cluster_sync(target, retry, kwargs))
    pool = redis.BlockingConnectionPool.from_url(url, retry=retry, **kwargs)
    return redis.Redis.from_pool(pool)


def is_cluster(client: object) -> bool:
    """True for a Redis Cluster client (asyncio or blocking) built by :func:`connect`."""
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


def pipe_evalsha(pipe: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue ``EVALSHA sha len(keys) *keys *args`` on ``pipe``, a pipeline of any layout.

    redis-py's cluster pipelines refuse their ``evalsha`` method, not the command: sent
    as a raw command it is routed by its keys' slot like any other (all of one script's
    keys must share a slot, as Sluice's do).
    """
    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)


def is_sentinel(client: object) -> bool:
    """True for a client of a Sentinel-watched master built by :func:`connect`."""
    return redisha.is_sentinel_pool(getattr(client, "connection_pool", None))


#: What a lost, refused or moving Redis raises, for callers that retry or report it: a
#: dropped connection, a Sentinel with no master yet (``MasterNotFoundError`` is a
#: ``ConnectionError``), a cluster in the middle of a failover or resharding
#: (``ClusterDownError``, ``TryAgainError``), a master demoted under a client or a
#: replica written to (``ReadOnlyError``, ``READONLY``) and a server out of memory with
#: ``noeviction`` (``OutOfMemoryError``, ``OOM``: writes refused, reads and deletes go on).
#: Each is over within a failover's time or once memory is freed; retrying is the cure.
#: A refused write did not happen, so retrying it is safe for any command.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    SlotNotCoveredError,
    OutOfMemoryError,
)

#: Write refusals redis-py has no class for, by the reply's first word: ``MISCONF`` (the
#: last RDB save failed and ``stop-writes-on-bgsave-error`` is on), ``NOREPLICAS`` (fewer
#: replicas connected than ``min-replicas-to-write``).
_REFUSED_CODES = ("MISCONF ", "NOREPLICAS ")


def unavailable(exc: BaseException) -> bool:
    """True when ``exc`` is Redis away or refusing writes for now (retry later), not a
    fault of the command: what :data:`UNAVAILABLE` matches, and a ``MISCONF`` or
    ``NOREPLICAS`` refusal.
    Callers that catch ``RedisError`` broadly ask this before giving up."""
    if isinstance(exc, UNAVAILABLE):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(_REFUSED_CODES)


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
    "is_cluster",
    "is_sentinel",
    "pipe_evalsha",
    "parse_entry_id",
    "unavailable",
    "checkpoint",
]
