"""One line at start when the Redis a URL names is laid out otherwise than the URL says.

:func:`check` looks once, with short-lived plain connections, for the mistakes that
would otherwise show as endless retries or tracebacks later:

- a Redis Cluster node given as ``redis://`` (every command on a key of another node
  would fail with MOVED), or a plain server given as ``redis+cluster://``;
- a replica given as the master (every write would fail with READONLY);
- Sentinels that do not know the service, or a ``redis+sentinel://`` host that is not
  a Sentinel at all.

A Redis that cannot be reached is not a misconfiguration: :func:`check` then returns
and the process's own retries wait for it, as they always did.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import redis
from redis.exceptions import AuthenticationError, ResponseError

from pipeline.errors import ConfigError
from pipeline.redisurl import RedisTarget, Topology, parse

log = logging.getLogger(__name__)

#: Socket bounds of the check's connections.
CHECK_TIMEOUT_S = 3.0


def _client(target: RedisTarget, host: str, port: int, password: str | None) -> redis.Redis:
    return redis.Redis(
        host=host,
        port=port,
        username=target.username if target.topology is not Topology.SENTINEL else None,
        password=password,
        ssl=target.tls,
        socket_timeout=CHECK_TIMEOUT_S,
        socket_connect_timeout=CHECK_TIMEOUT_S,
    )


def _info(target: RedisTarget, host: str, port: int) -> dict[str, Any] | None:
    """INFO of one data node (None: unreachable, or INFO refused)."""
    client = (
        redis.Redis.from_url(
            target.url, socket_timeout=CHECK_TIMEOUT_S, socket_connect_timeout=CHECK_TIMEOUT_S
        )
        if target.topology is Topology.SINGLE
        else _client(target, host, port, target.password)
    )
    try:
        info: dict[str, Any] = client.info("cluster")
        info.update(client.info("replication"))
        return info
    except AuthenticationError as exc:
        raise ConfigError(f"redis at {host}:{port} refused the credentials: {exc}") from exc
    except (redis.ConnectionError, redis.TimeoutError, OSError, ResponseError) as exc:
        log.info("redis check: %s:%s not checked: %r", host, port, exc)
        return None
    finally:
        client.close()


def _check_single(target: RedisTarget) -> None:
    if target.url.startswith("unix:"):
        host, port = target.hosts[0][0], 0
    else:
        host, port = target.hosts[0]
    info = _info(target, host, port)
    if info is None:
        return
    if int(info.get("cluster_enabled", 0)) == 1:
        raise ConfigError(
            f"{target.safe_url} is a Redis Cluster node: use "
            f"redis{'s' if target.tls else ''}+cluster://{host}:{port}"
        )
    if info.get("role") == "slave":
        raise ConfigError(
            f"{target.safe_url} is a replica of {info.get('master_host')}:"
            f"{info.get('master_port')}: give the master, or redis+sentinel:// to follow failovers"
        )


def _check_cluster(target: RedisTarget) -> None:
    for host, port in target.hosts:
        info = _info(target, host, port)
        if info is None:
            continue
        if int(info.get("cluster_enabled", 0)) != 1:
            raise ConfigError(
                f"{host}:{port} of {target.safe_url} is not a Redis Cluster node (cluster_enabled:0): "
                f"use redis{'s' if target.tls else ''}://{host}:{port}"
            )
        return


def _check_sentinel(target: RedisTarget) -> None:
    known: set[str] = set()
    answered = 0
    for host, port in target.hosts:
        client = _client(target, host, port, target.sentinel_password)
        try:
            masters = cast(dict[str, Any], client.sentinel_masters())
        except AuthenticationError as exc:
            raise ConfigError(f"sentinel {host}:{port} refused the credentials: {exc}") from exc
        except ResponseError as exc:
            raise ConfigError(
                f"{host}:{port} of {target.safe_url} is not a Sentinel ({exc}); "
                "a redis+sentinel:// URL lists the Sentinels, not the data nodes"
            ) from exc
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.info("redis check: sentinel %s:%s not checked: %r", host, port, exc)
            continue
        finally:
            client.close()
        answered += 1
        if target.service in masters:
            return
        known.update(masters)
    if answered:
        raise ConfigError(
            f"no Sentinel of {target.safe_url} knows the service {target.service!r} "
            f"(they know: {', '.join(sorted(known)) or 'none'})"
        )


def check(url: str) -> None:
    """Raise :class:`ConfigError` (one line) if ``url`` names a misconfigured Redis.

    Blocking (a few round trips, each bounded by :data:`CHECK_TIMEOUT_S`); run it
    once at a process's start. Returns quietly when Redis cannot be reached.
    """
    target = parse(url)
    if target.topology is Topology.SINGLE:
        _check_single(target)
    elif target.topology is Topology.CLUSTER:
        _check_cluster(target)
    else:
        _check_sentinel(target)


__all__ = ["CHECK_TIMEOUT_S", "check"]
