"""The one Redis client factory: pools, timeouts and TLS per role."""

from __future__ import annotations

import asyncio

import pytest
import redis

from pipeline.errors import ConfigError
from pipeline.redisio.conn import (
    BLOCK_MARGIN_S,
    BOUNDS,
    Role,
    connect,
    connect_sync,
    parse_entry_id,
)


def test_rediss_keeps_tls_and_redis_does_not() -> None:
    tls = connect_sync("rediss://example.invalid:6380/0", Role.LAKE)
    plain = connect_sync("redis://example.invalid:6379/0", Role.LAKE)
    assert tls.connection_pool.connection_class is redis.SSLConnection
    assert plain.connection_pool.connection_class is redis.Connection


@pytest.mark.parametrize("role", list(Role))
def test_every_role_has_a_bounded_pool(role: Role) -> None:
    client = connect_sync("redis://127.0.0.1:1/0", role)
    pool = client.connection_pool
    assert isinstance(pool, redis.BlockingConnectionPool)
    assert pool.max_connections == BOUNDS[role].max_connections
    limit = BOUNDS[role].socket_timeout_s
    if limit is None:  # the caller's deadline bounds each command (Role.STREAM_HOT)
        assert pool.connection_kwargs["socket_timeout"] is None
    else:
        assert pool.connection_kwargs["socket_timeout"] >= limit
    assert pool.connection_kwargs["socket_connect_timeout"] == BOUNDS[role].connect_timeout_s


def test_socket_timeout_outlasts_the_longest_blocking_wait() -> None:
    client = connect("redis://127.0.0.1:1/0", Role.BUS_CLIENT, block_s=120)
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 120 + BLOCK_MARGIN_S
    asyncio.run(client.aclose())


def test_bad_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a redis URL"):
        connect_sync("http://127.0.0.1:6379", Role.CLI)


def test_entry_ids() -> None:
    assert parse_entry_id(b"1700000000000-3") == (1700000000000, 3)
    for bad in ("", "12", "a-1", "1-", "-1", "1-2-3"):
        with pytest.raises(ValueError):
            parse_entry_id(bad)


@pytest.mark.parametrize("role", list(Role))
def test_sentinel_clients_have_the_roles_bounds(role: Role) -> None:
    """A Sentinel client's pool waits for a free connection like a single server's, with
    the same socket bounds, and its connections ask the Sentinels for the master."""
    from redis.sentinel import SentinelConnectionPool

    client = connect_sync("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/3", role, block_s=40)
    pool = client.connection_pool
    assert isinstance(pool, redis.BlockingConnectionPool) and isinstance(
        pool, SentinelConnectionPool
    )
    assert pool.max_connections == BOUNDS[role].max_connections
    assert pool.service_name == "svc" and pool.connection_kwargs["db"] == 3
    limit = BOUNDS[role].socket_timeout_s
    expected = None if limit is None else max(limit, 40 + BLOCK_MARGIN_S)
    assert pool.connection_kwargs["socket_timeout"] == expected
    assert [
        s.connection_pool.connection_kwargs["port"] for s in pool.sentinel_manager.sentinels
    ] == [1, 2]
    client.close()


def test_cluster_client_carries_the_roles_bounds_to_every_node() -> None:
    from redis.asyncio.cluster import RedisCluster

    client = connect("redis+cluster://127.0.0.1:1,127.0.0.1:2", Role.SERVE)
    assert isinstance(client, RedisCluster)
    assert client.connection_kwargs["socket_timeout"] == BOUNDS[Role.SERVE].socket_timeout_s
    assert (
        client.connection_kwargs["socket_connect_timeout"] == BOUNDS[Role.SERVE].connect_timeout_s
    )
    assert sorted(n.port for n in client.nodes_manager.startup_nodes.values()) == [1, 2]
    asyncio.run(client.aclose())


def test_write_refusals_count_as_unavailable() -> None:
    # What redis-py raises for an OOM / READONLY / MISCONF reply (seen from redis-server 7).
    from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

    from pipeline.redisio.conn import UNAVAILABLE, unavailable

    oom = OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    assert isinstance(oom, UNAVAILABLE) and unavailable(oom)
    assert unavailable(ReadOnlyError("You can't write against a read only replica."))
    assert unavailable(ResponseError("MISCONF Redis is configured to save RDB snapshots, but ..."))
    assert not unavailable(
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
    )
    assert not unavailable(ValueError("MISCONF"))
