"""One ``Settings`` object, read from ``SLUICE_*`` variables and an optional ``sluice.toml``.

Precedence, highest first: explicit keyword arguments, environment variables,
the ``[sluice]`` table of ``sluice.toml`` (path in ``SLUICE_CONFIG``, default
``./sluice.toml`` if present), then the embedded defaults below. The defaults
run everything on one machine: a private ``redis-server``, Spark
``local[*]``, Airflow on SQLite, the lake under ``./var/``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

from pipeline.errors import ConfigError

_PREFIX = "SLUICE_"


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSettings:
    """Where Redis is: host, port, db and optional password."""

    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    password: str | None = None

    @classmethod
    def from_url(cls, url: str) -> RedisSettings:
        """Parse ``redis://[:password@]host[:port][/db]``."""
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss"):
            raise ConfigError(f"not a redis URL: {url!r}")
        db_text = parsed.path.lstrip("/") or "0"
        if not db_text.isdigit():
            raise ConfigError(f"redis db must be a number in {url!r}")
        return cls(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 6379,
            db=int(db_text),
            password=unquote(parsed.password) if parsed.password else None,
        )

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/{self.db}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LakeSettings:
    """Where the Delta tables live: a local path or an object-store URI."""

    uri: str = "./var/lake"

    @classmethod
    def from_url(cls, url: str) -> LakeSettings:
        if not url:
            raise ConfigError("empty lake URI")
        if "://" not in url or url.startswith("file://"):
            path = url.removeprefix("file://")
            return cls(uri=str(Path(path).expanduser().absolute()))
        return cls(uri=url)

    def table(self, name: str) -> str:
        """The URI of one table under the lake root."""
        return f"{self.uri.rstrip('/')}/{name}"


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every setting of Sluice. Field ``x`` is read from ``SLUICE_X``."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    lake_uri: str = "./var/lake"
    var_dir: str = "./var"
    spark_master: str = "local[*]"
    #: ``sc://host:port`` of a Spark Connect server: lake jobs become thin clients ("" = local JVM).
    spark_remote: str = ""
    #: Comma-separated Delta jar paths for the local one-JVM mode ("" = the cache ``make install`` wrote).
    spark_jars: str = ""
    #: Heap of a local Spark driver (one-JVM mode and ``sluice spark``).
    spark_driver_memory: str = "1g"
    #: Port ``sluice spark`` listens on.
    spark_connect_port: int = 15002
    spark_shuffle_partitions: int = 4
    #: Streams archived by ``sluice_archive`` (logical stream names).
    streams: tuple[str, ...] = ("chain:demo",)
    #: Which of those carry one block batch per entry.
    chain_streams: tuple[str, ...] = ("chain:demo",)
    archive_cron: str = "*/5 * * * *"
    archive_partitions: int = 4
    #: Entries younger than this stay in Redis even when archived.
    hot_retention_s: int = 3600
    reorg_threshold: int = 64
    #: Largest routed message / frame / stream payload accepted, in bytes.
    max_payload: int = 1 << 20
    # routing and streams
    node_name: str = "node"
    node_workers: tuple[str, ...] = ("echo",)
    node_listen: str = ""
    #: TCP transport: most connections (in + out); at the bound the stalest inbound one is evicted.
    node_tcp_max_connections: int = 256
    #: Seconds a new inbound TCP connection has to complete its first Dialogue frame.
    node_tcp_first_frame_s: float = 10.0
    #: Seconds one Dialogue frame may take once its first byte arrived (cuts trickled frames).
    node_tcp_frame_s: float = 30.0
    #: A TCP connection with no byte either way and nothing outstanding is closed after this.
    node_tcp_idle_s: float = 300.0
    consumer_max_failures: int = 3
    lease_ttl_s: int = 15
    #: ``host:port`` of the node's ``/healthz`` and ``/metrics`` (empty: off).
    node_health_listen: str = ""
    # reliable message bus
    bus_twin: int = 0
    bus_listen: str = "127.0.0.1:8051"
    bus_directory: str = ""
    bus_key_file: str = ""
    bus_legacy_peers: bool = False
    #: ``host:port`` of the bus's ``/healthz`` and ``/metrics`` (empty: off).
    bus_health_listen: str = ""
    #: ``exp`` 0 means this many seconds; larger ``exp`` values are capped at bus_max_exp_s.
    bus_default_exp_s: int = 300
    bus_max_exp_s: int = 86400
    #: ``try`` is capped at this many retries; backoff doubles from base up to max.
    bus_max_try: int = 16
    bus_retry_base_s: float = 0.1
    bus_retry_max_s: float = 2.0
    #: Signed bus-to-bus POSTs are accepted this far from the receiver's clock (replay window).
    bus_replay_window_s: float = 300.0
    #: Request uids remembered against replays (then 503 until the window moves on).
    bus_max_seen: int = 2_000_000
    #: Handling attempts of one message before it goes to ``msgbus.system.dead``.
    bus_max_attempts: int = 3
    #: Inbound HTTP: a connection with no completed request for this long is closed.
    bus_http_idle_s: float = 30.0
    bus_http_max_connections: int = 1024
    # resumption server
    serve_host: str = "127.0.0.1"
    serve_port: int = 8765
    serve_stream: str = "chain:demo"
    serve_token: str = ""
    serve_send_buffer: int = 4096
    serve_heartbeat_s: float = 20.0
    #: TCP port of the same feed over Dialogue duplexes (0: off).
    serve_dialogue_port: int = 0
    #: Decoded lake history kept in memory by ``sluice serve`` (MiB, LRU by data file; 0: off).
    serve_history_cache_mb: int = 512
    #: Redis tail entries ``sluice serve`` indexes by block number (about 0.7 KB each);
    #: older entries are served from the lake.
    serve_tail_index_max: int = 500_000
    log_level: str = "INFO"
    # Airflow side of the lake (dags/, plugins/)
    #: Wall-clock limit of one lake job child process (archive, canonical, trim...).
    lake_job_timeout_s: int = 1800
    #: How many Spark lake jobs (archive, canonical) of one DAG may run at once.
    archive_parallelism: int = 1
    #: Retries of a failed lake task (every lake job is idempotent, so retrying is safe).
    lake_task_retries: int = 2
    #: How long a lake job waits for its stream's archive lock (another job on the stream).
    lake_lock_wait_s: int = 600

    @property
    def redis(self) -> RedisSettings:
        return RedisSettings.from_url(self.redis_url)

    @property
    def lake(self) -> LakeSettings:
        return LakeSettings.from_url(self.lake_uri)

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Build settings from ``sluice.toml``, then ``SLUICE_*``, then ``overrides``."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        path = Path(config_path or env.get(_PREFIX + "CONFIG", "sluice.toml"))
        # A missing file means "no config file"; one that exists must be readable TOML.
        if path.exists():
            try:
                doc = tomllib.loads(path.read_text())
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise ConfigError(f"cannot read config file {path}: {reason or exc}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{path}: {exc}") from exc
            table = doc.get("sluice", {})
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: [sluice] must be a table")
            values.update(table)
        for f in fields(cls):
            raw = env.get(_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = raw
        values.update(overrides)
        settings = cls(**{k: _coerce(k, v) for k, v in values.items()})
        _validate(settings)
        return settings

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


_FIELD_TYPES = {f.name: f.type for f in fields(Settings)}


def _validate(settings: Settings) -> None:
    """Refuse values no part can run with: :class:`ConfigError` naming the setting."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.type in ("int", "float"):
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"setting {f.name!r} must be a non-negative number, got {value}")
            if f.name.endswith("_port") and value > 65535:
                raise ConfigError(f"setting {f.name!r} must be a TCP port (0-65535), got {value}")
        elif f.name.endswith("_listen") and value:
            _, sep, port = str(value).rpartition(":")
            if not sep or not port.isdigit() or int(port) > 65535:
                raise ConfigError(f"setting {f.name!r} must be host:port, got {value!r}")
    if not settings.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"setting 'redis_url' must start with redis://, rediss:// or unix://, "
            f"got {settings.redis_url!r}"
        )
    if not settings.redis_url.startswith("unix://"):
        try:
            urlparse(settings.redis_url).port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ConfigError(f"setting 'redis_url': {exc}: {settings.redis_url!r}") from exc
        RedisSettings.from_url(settings.redis_url)  # the db must be a number
    levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    if settings.log_level.upper() not in levels:
        raise ConfigError(
            f"setting 'log_level' must be one of {', '.join(levels)}, got {settings.log_level!r}"
        )


def _coerce(name: str, value: Any) -> Any:
    kind = _FIELD_TYPES.get(name)
    if kind is None:
        raise ConfigError(f"unknown setting {name!r}")
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            return str(value).strip().lower() in ("1", "true", "yes", "on")
        if kind == "tuple[str, ...]":
            return _split(value) if isinstance(value, str) else tuple(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name!r}: cannot read {value!r} as {kind}") from exc


__all__ = ["LakeSettings", "RedisSettings", "Settings", "field"]
