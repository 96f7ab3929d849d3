"""One line at start when the Redis a URL names is laid out otherwise than the URL says.

:func:`check` looks once, with short-lived plain connections, for the mistakes that
would otherwise show as endless retries or tracebacks later:

- a Redis Cluster node given as ``redis://`` (every command on a key of another node
  would fail with MOVED), or a plain server given as ``redis+cluster://``;
- a replica given as the master (every write would fail with READONLY);
- Sentinels that do not know the service, or a ``redis+sentinel://`` host that is not
  a Sentinel at all.

A Redis that cannot be reached is not a misconfiguration: :func:`check` then returns
and the process's own retries wait for it, as they always did. An always-on process
(it passes ``command``) would then meet the mistake only mid-run, as endless MOVED or
READONLY errors: there the check is deferred (:func:`_watch`) to the first time Redis
answers, and a misconfiguration found then ends the process with the same one line and
exit code 2 as at start.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, cast

import redis
from redis.exceptions import AuthenticationError, ResponseError

from pipeline.errors import ConfigError
from pipeline.redisio.url import RedisTarget, Topology, parse

log = logging.getLogger(__name__)

#: Socket bounds of the check's connections.
CHECK_TIMEOUT_S = 3.0
#: Seconds between the looks of a deferred check (Redis unreachable at start).
RECHECK_S = 1.0
#: Exit code of a process whose deferred check found a misconfiguration (bad input).
EXIT_MISCONFIGURED = 2


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


def _info(target: RedisTarget, host: str, port: int, quiet: bool) -> dict[str, Any] | None:
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
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "redis check: %s:%s not checked: %r",
            host,
            port,
            exc,
        )
        return None
    finally:
        client.close()


def _check_single(target: RedisTarget, quiet: bool) -> bool:
    if target.url.startswith("unix:"):
        host, port = target.hosts[0][0], 0
    else:
        host, port = target.hosts[0]
    info = _info(target, host, port, quiet)
    if info is None:
        return False
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
    return True


def _check_cluster(target: RedisTarget, quiet: bool) -> bool:
    for host, port in target.hosts:
        info = _info(target, host, port, quiet)
        if info is None:
            continue
        if int(info.get("cluster_enabled", 0)) != 1:
            raise ConfigError(
                f"{host}:{port} of {target.safe_url} is not a Redis Cluster node (cluster_enabled:0): "
                f"use redis{'s' if target.tls else ''}://{host}:{port}"
            )
        return True
    return False


def _check_sentinel(target: RedisTarget, quiet: bool) -> bool:
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
            log.log(
                logging.DEBUG if quiet else logging.INFO,
                "redis check: sentinel %s:%s not checked: %r", host, port, exc,
            )  # fmt: skip
            continue
        finally:
            client.close()
        answered += 1
        if target.service in masters:
            return True
        known.update(masters)
    if answered:
        raise ConfigError(
            f"no Sentinel of {target.safe_url} knows the service {target.service!r} "
            f"(they know: {', '.join(sorted(known)) or 'none'})"
        )
    return False


def _look(target: RedisTarget, quiet: bool = False) -> bool:
    """One check of ``target``; True when some node answered (and it is laid out well).
    ``quiet``: an unreachable node is logged at DEBUG (the deferred check's repeats)."""
    if target.topology is Topology.SINGLE:
        return _check_single(target, quiet)
    if target.topology is Topology.CLUSTER:
        return _check_cluster(target, quiet)
    return _check_sentinel(target, quiet)


def check(url: str, *, command: str | None = None) -> None:
    """Raise :class:`ConfigError` (one line) if ``url`` names a misconfigured Redis.

    Blocking (a few round trips, each bounded by :data:`CHECK_TIMEOUT_S`); run it
    once at a process's start. Returns quietly when Redis cannot be reached; then,
    for an always-on process (``command``: its name in ``sluice COMMAND``), the check
    runs again in the background until Redis answers (:func:`_watch`).
    """
    target = parse(url)
    if not _look(target) and command is not None:
        _watch(target, command)


def _watch(target: RedisTarget, command: str) -> threading.Thread:
    """Look at ``target`` every :data:`RECHECK_S` in a daemon thread until a node answers.

    A misconfiguration found then is logged, printed as the CLI prints one at start
    (``sluice COMMAND: ...``) and ends the process at once with
    :data:`EXIT_MISCONFIGURED`: no command it sent can have succeeded (Redis never
    answered it as the URL says), and retrying would never end. One thread and one
    short-lived connection at a time.
    """

    log.info(
        "redis check: no Redis of %s answered; checking again every %gs until one does",
        target.safe_url, RECHECK_S,
    )  # fmt: skip

    def run() -> None:
        while True:
            try:
                if _look(target, quiet=True):
                    log.info("redis check: %s answered, laid out as the URL says", target.safe_url)
                    return
            except ConfigError as exc:
                log.error("redis check: %s", exc)
                sys.stderr.write(f"sluice {command}: {exc}\n")
                sys.stderr.flush()
                logging.shutdown()
                os._exit(EXIT_MISCONFIGURED)
            time.sleep(RECHECK_S)

    thread = threading.Thread(target=run, name="redis-check", daemon=True)
    thread.start()
    return thread


__all__ = ["CHECK_TIMEOUT_S", "EXIT_MISCONFIGURED", "RECHECK_S", "check"]
