"""A Redis hook that reads an Airflow connection, falling back to Sluice's settings.

Resolution order for the Redis URL, first match wins:

1. the Airflow connection ``sluice_redis`` (or the id given), from the
   metadata DB, a secrets backend or ``AIRFLOW_CONN_SLUICE_REDIS``;
2. ``SLUICE_REDIS_URL`` / ``sluice.toml`` through :class:`pipeline.settings.Settings`.

The lake jobs run in child processes; the runner hands them the resolved URL
as ``SLUICE_REDIS_URL`` so the connection is the single source of truth.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from pipeline.errors import ConfigError
from pipeline.settings import RedisSettings, Settings

log = logging.getLogger(__name__)


class SluiceRedisHook(BaseHook):
    """Where Sluice's Redis is, as a URL or a ready ``redis.Redis`` client."""

    conn_name_attr = "redis_conn_id"
    default_conn_name = "sluice_redis"
    conn_type = "redis"
    hook_name = "Sluice Redis"

    def __init__(
        self, redis_conn_id: str = default_conn_name, settings: Settings | None = None
    ) -> None:
        super().__init__()
        self.redis_conn_id = redis_conn_id
        self._settings = settings

    def get_url(self) -> str:
        """The Redis URL of the connection, or ``settings.redis.url`` when it is not defined."""
        try:
            conn = self.get_connection(self.redis_conn_id)
        except AirflowNotFoundException:
            settings = self._settings or Settings.load()
            log.info(
                "no Airflow connection %r: using SLUICE_REDIS_URL / settings", self.redis_conn_id
            )
            # The URL as configured: its scheme (rediss:// = TLS) must survive.
            RedisSettings.from_url(settings.redis.url)
            return settings.redis.url
        return connection_url(
            host=conn.host,
            port=conn.port,
            password=conn.password,
            schema=conn.schema,
            extra=conn.extra_dejson,
            conn_type=conn.conn_type,
        )

    def get_conn(self) -> Any:
        """A ``redis.Redis`` client for :meth:`get_url` (the caller closes it)."""
        from pipeline.redisio.conn import Role, connect_sync

        return connect_sync(self.get_url(), Role.CLI)

    def test_connection(self) -> tuple[bool, str]:
        # imported here: every task process parses the DAGs, and redis costs it ~70 ms
        from redis.exceptions import RedisError

        client = self.get_conn()
        try:
            client.ping()
        except (RedisError, OSError) as exc:  # reported to the UI: this is the check itself
            return False, f"redis ping failed: {exc}"
        finally:
            client.close()
        return True, "redis answered PING"


def connection_url(
    *,
    host: str | None,
    port: int | None,
    password: str | None,
    schema: str | None,
    extra: dict[str, Any],
    conn_type: str | None = None,
) -> str:
    """Build ``redis[s]://[:password@]host:port/db`` from connection fields.

    The database comes from ``extra["db"]`` or the connection's schema (what
    ``AIRFLOW_CONN_X=redis://host:port/3`` sets). TLS (``rediss``) when the
    connection was given as a ``rediss://`` URI (its ``conn_type``) or
    ``extra["ssl"]`` is true. ``extra["url"]``, when set, is the whole URL in any form
    Sluice takes (``redis+sentinel://...``, ``redis+cluster://...``: a Sentinel group
    or a cluster has no single host and port) and the other fields are ignored.
    """
    if extra.get("url"):
        url = str(extra["url"])
        RedisSettings.from_url(url)
        return url
    if not host:
        raise ConfigError("the Redis connection has no host")
    db_raw = extra.get("db", schema or 0)
    try:
        db = int(db_raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the Redis connection's db must be a number, got {db_raw!r}") from exc
    tls = conn_type == "rediss" or str(extra.get("ssl", "")).lower() in ("1", "true", "yes")
    scheme = "rediss" if tls else "redis"
    auth = f":{quote(password, safe='')}@" if password else ""
    url = f"{scheme}://{auth}{host}:{port or 6379}/{db}"
    RedisSettings.from_url(url)  # the same validation the lake jobs apply
    return url
