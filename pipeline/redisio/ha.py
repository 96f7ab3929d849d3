"""Redis beyond one server: clients of a Sentinel-watched master and of a Redis Cluster.

Built only by :mod:`pipeline.redisio.conn` (with its per-role bounds); this module holds
what differs from a single server:

- Sentinel: redis-py's ``Sentinel.master_for`` with a *blocking* pool (the same bounded
  wait for a free connection as on one server). Each new connection asks the
  Sentinels where the master is, so after a failover the next connection goes to the
  new master; a connection still open to a demoted master gets ``READONLY``, which
  redis-py turns into a ``ConnectionError`` (and the retry reconnects). Closing the
  client closes the Sentinel connections too. A single-connection client
  (``Redis.client()``) of such a pool does *not* follow: redis-py 8.1 reconnects it
  to the old master's address, so Sluice takes every command from the pool there.
- Cluster: redis-py's ``RedisCluster``, which follows MOVED and ASK, refreshes its slot
  map after a connection error, and retries ``ClusterDown``/``TryAgain`` as many times
  as the role's retries. Its pools are per node and do not wait: ``max_connections``
  is per node.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.sentinel as aiosentinel
import redis.cluster as synccluster
import redis.sentinel as syncsentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from pipeline.redisio.url import RedisTarget

#: Socket bounds of the connections to the Sentinels themselves (each answers at once).
SENTINEL_SOCKET_S = 2.0


def _to_front(sentinels: list[Any], sentinel: Any) -> None:
    """Move ``sentinel`` (the one that named the master) to the front of ``sentinels``.

    redis-py 8.1's ``discover_master`` swaps ``sentinels[0]`` with the position it read
    *before* awaiting the Sentinel's answer. Two discoveries interleaving (every new
    connection of a pool discovers; dozens at once in a failover, when the first Sentinel
    still calls the old master down) then write one client into both places and drop
    another from the list: its connections were never closed (``aclose`` closes the
    list) and were garbage-collected open. Here the position is looked up at the swap.
    """
    i = sentinels.index(sentinel)
    sentinels[0], sentinels[i] = sentinels[i], sentinels[0]


class _AsyncSentinel(aiosentinel.Sentinel):
    """redis-py's asyncio Sentinel manager with a discovery that concurrent callers cannot
    corrupt (see :func:`_to_front`)."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors = []
        for sentinel in list(self.sentinels):
            try:
                masters: dict[str, Any] = await sentinel.sentinel_masters()  # type: ignore[assignment]
            except (RedisConnectionError, RedisTimeoutError) as exc:
                errors.append(f"{sentinel} - {exc!r}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                _to_front(self.sentinels, sentinel)
                return state["ip"], state["port"]
        raise aiosentinel.MasterNotFoundError(
            f"No master found for {service_name!r} : {', '.join(errors)}"
        )


class _SyncSentinel(syncsentinel.Sentinel):
    """The blocking twin of :class:`_AsyncSentinel` (threads share a blocking client)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._reorder = threading.Lock()

    def discover_master(self, service_name: str) -> tuple[str, int]:
        errors = []
        for sentinel in list(self.sentinels):
            try:
                masters: dict[str, Any] = sentinel.sentinel_masters()  # type: ignore[assignment]
            except (RedisConnectionError, RedisTimeoutError) as exc:
                errors.append(f"{sentinel} - {exc!r}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                with self._reorder:
                    _to_front(self.sentinels, sentinel)
                return state["ip"], state["port"]
        raise syncsentinel.MasterNotFoundError(
            f"No master found for {service_name!r} : {', '.join(errors)}"
        )


class _AsyncSentinelPool(aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A Sentinel pool that waits for a free connection (as ``BlockingConnectionPool``)."""

    async def aclose(self) -> None:
        await super().aclose()
        await self.sentinel_manager.aclose()


class _SyncSentinelPool(syncsentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """The blocking client's pool of a Sentinel-watched master (see :class:`_AsyncSentinelPool`)."""

    def close(self) -> None:
        super().close()
        for client in self.sentinel_manager.sentinels:
            client.close()


def is_sentinel_pool(pool: object) -> bool:
    """True for the pool of a client :func:`sentinel_async` or :func:`sentinel_sync` built."""
    return isinstance(pool, _AsyncSentinelPool | _SyncSentinelPool)


def _sentinel_kwargs(target: RedisTarget, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "socket_timeout": SENTINEL_SOCKET_S,
        "socket_connect_timeout": min(SENTINEL_SOCKET_S, kwargs["socket_connect_timeout"]),
        "password": target.sentinel_password,
        "ssl": target.tls,
    }


def _node_kwargs(target: RedisTarget, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        **kwargs,
        "username": target.username,
        "password": target.password,
        "ssl": target.tls,
    }


def sentinel_async(
    target: RedisTarget, retry: AsyncRetry, kwargs: dict[str, Any]
) -> aioredis.Redis:
    """An asyncio client of the master of ``target.service`` (``kwargs``: pool and socket bounds)."""
    sentinel = _AsyncSentinel(  # type: ignore[no-untyped-call]
        list(target.hosts), sentinel_kwargs=_sentinel_kwargs(target, kwargs)
    )
    client: aioredis.Redis = sentinel.master_for(
        target.service,
        redis_class=aioredis.Redis,
        connection_pool_class=_AsyncSentinelPool,
        retry=retry,
        db=target.db,
        **_node_kwargs(target, kwargs),
    )
    return client


def sentinel_sync(target: RedisTarget, retry: SyncRetry, kwargs: dict[str, Any]) -> redis.Redis:
    """The blocking twin of :func:`sentinel_async`."""
    sentinel = _SyncSentinel(list(target.hosts), sentinel_kwargs=_sentinel_kwargs(target, kwargs))
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service,
        redis_class=redis.Redis,
        connection_pool_class=_SyncSentinelPool,
        retry=retry,
        db=target.db,
        **_node_kwargs(target, kwargs),
    )
    return client


def _cluster_kwargs(target: RedisTarget, kwargs: dict[str, Any]) -> dict[str, Any]:
    out = _node_kwargs(target, kwargs)
    out.pop("timeout")  # a cluster's per-node pools do not wait for a free connection
    return out


def cluster_async(
    target: RedisTarget, retry: AsyncRetry, kwargs: dict[str, Any]
) -> aiocluster.RedisCluster:
    """An asyncio ``RedisCluster`` that starts from the nodes of ``target``."""
    return aiocluster.RedisCluster(
        startup_nodes=[aiocluster.ClusterNode(host, port) for host, port in target.hosts],
        retry=retry,
        **_cluster_kwargs(target, kwargs),
    )


def cluster_sync(
    target: RedisTarget, retry: SyncRetry, kwargs: dict[str, Any]
) -> synccluster.RedisCluster:
    """The blocking twin of :func:`cluster_async`."""
    return synccluster.RedisCluster(
        startup_nodes=[
            synccluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
            for host, port in target.hosts
        ],
        retry=retry,
        **_cluster_kwargs(target, kwargs),
    )


__all__ = [
    "cluster_async",
    "cluster_sync",
    "is_sentinel_pool",
    "sentinel_async",
    "sentinel_sync",
]
