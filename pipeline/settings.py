"""One ``Settings`` object, nested per part, read from ``SLUICE_*`` variables and ``sluice.toml``.

``settings.redis``, ``settings.lake``, ``settings.spark``, ``settings.node``,
``settings.bus`` and ``settings.serve`` are frozen sections; ``var_dir``,
``max_payload`` and ``log_level`` sit at the top. Every setting also has one
flat name, the one users write: section field ``bus.twin`` is ``bus_twin``,
read from ``SLUICE_BUS_TWIN`` or ``bus_twin = 1`` under ``[sluice]`` (or
``twin = 1`` under ``[sluice.bus]``). A few lake fields keep their historic
prefix-free names (``streams``, ``archive_cron``, ``hot_retention_s``...), and
``node`` holds the stream service's ``consumer_max_failures`` and
``lease_ttl_s``.

Precedence, highest first: explicit keyword arguments, environment variables,
``sluice.toml`` (path in ``SLUICE_CONFIG``, default ``./sluice.toml`` if
present), then the embedded defaults below. The defaults run everything on one
machine: a private ``redis-server``, Spark ``local[*]``, Airflow on SQLite, the
lake under ``./var/``.

Values are coerced by each field's declared type and every section checks
itself when built (``__post_init__``), so a ``Settings`` that exists is valid
however it was made (``load``, ``replace``, the constructor). Every bad value
raises :class:`~pipeline.errors.ConfigError` naming the flat setting, and the
environment variable or file it came from when ``load`` read it there.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import tomllib
import typing
from collections.abc import Collection, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, ClassVar
from urllib.parse import urlparse

from pipeline.errors import ConfigError
from pipeline.redisio import url as redisurl

_PREFIX = "SLUICE_"

#: Default of ``max_payload``: largest routed message / frame / stream payload, in bytes.
MAX_PAYLOAD = 1 << 20

#: URI schemes of a lake on object storage.
OBJECT_STORE_SCHEMES = ("s3://", "s3a://")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _Rule(enum.Enum):
    """A check beyond the type, attached to a field's annotation."""

    PORT = "port"
    LISTEN = "listen"


#: A TCP port, 0-65535 (0: let the system pick, or "off" where documented).
Port = Annotated[int, _Rule.PORT]
#: ``host:port`` to listen on; empty means off.
Listen = Annotated[str, _Rule.LISTEN]


def _bare(default: Any) -> Any:
    """A section field whose flat name is its own name (no section prefix)."""
    return field(default=default, metadata={"bare": True})


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSettings:
    """Where Redis is: one URL in any form of :mod:`pipeline.redisio.url`.

    ``redis://[:password@]host[:port][/db]``, ``rediss://`` (TLS) or ``unix://`` for one
    server; ``redis+sentinel://host:port,host:port/service[/db]`` for the master a group
    of Sentinels watches; ``redis+cluster://host:port[,host:port]`` for a Redis Cluster.
    """

    _SECTION: ClassVar[str] = "redis"

    url: str = "redis://127.0.0.1:6379/0"
    #: Replicas that must hold a stream push, XADD or bus backlog write before Sluice
    #: counts it as done (Redis ``WAIT``); 0: the master's reply is enough.
    min_replicas: int = 0
    #: How long one such ``WAIT`` may take, in milliseconds.
    min_replicas_timeout_ms: int = 1000

    def __post_init__(self) -> None:
        _check(self)
        try:
            redisurl.parse(self.url)
        except ConfigError as exc:
            raise _invalid(self, "url", str(exc)) from None

    @classmethod
    def from_url(cls, url: str) -> RedisSettings:
        """Check ``url`` (:class:`ConfigError` if it is not a Redis URL) and wrap it."""
        return cls(url=url)

    @property
    def topology(self) -> redisurl.Topology:
        """Single server, Sentinel or Cluster."""
        return redisurl.parse(self.url).topology

    @property
    def host(self) -> str:
        """The host name (for ``unix://``, the socket path; Sentinel, Cluster: the first listed)."""
        return redisurl.parse(self.url).hosts[0][0]

    @property
    def port(self) -> int:
        """The TCP port (0 for ``unix://``; Sentinel, Cluster: of the first host listed)."""
        return redisurl.parse(self.url).hosts[0][1]

    @property
    def db(self) -> int:
        return redisurl.parse(self.url).db

    @property
    def password(self) -> str | None:
        return redisurl.parse(self.url).password


@dataclass(frozen=True, slots=True, kw_only=True)
class LakeSettings:
    """The Delta lake and the Airflow jobs that fill and keep it."""

    _SECTION: ClassVar[str] = "lake"

    #: Root of the Delta tables: a local path (made absolute when built) or an object-store URI.
    uri: str = "./var/lake"
    #: Streams archived by ``sluice_archive`` (logical stream names).
    streams: tuple[str, ...] = _bare(("chain:demo",))
    #: Which of those carry one block batch per entry.
    chain_streams: tuple[str, ...] = _bare(("chain:demo",))
    archive_cron: str = _bare("*/5 * * * *")
    archive_partitions: int = _bare(4)
    #: How the archive writes: ``arrow`` (tasks write Parquet with pyarrow, the driver commits
    #: with delta-rs; the Spark writer where the lake already holds part of the interval) or
    #: ``spark`` (always the Spark writer). See :mod:`pipeline.lake.write.arrowwrite`.
    archive_writer: str = _bare("arrow")
    #: How many Spark lake jobs (archive, canonical) of one DAG may run at once.
    archive_parallelism: int = _bare(1)
    #: How many streams one shared archive job (``archive-streams``) archives at once: a slow
    #: stream (a MERGE, a catch-up) holds one of them, never the rest.
    archive_job_workers: int = _bare(64)
    #: Entries younger than this stay in Redis even when archived.
    hot_retention_s: int = _bare(3600)
    reorg_threshold: int = _bare(64)
    #: Wall-clock limit of one lake job child process (archive, canonical, trim...).
    job_timeout_s: int = 1800
    #: Retries of a failed lake task (every lake job is idempotent, so retrying is safe).
    task_retries: int = 2
    #: How long a lake job waits for its stream's archive lock (another job on the stream).
    lock_wait_s: int = 600
    # Object storage (a lake at ``s3://bucket/prefix``): passed to delta-rs, pyarrow and
    # Spark alike through :meth:`storage_options` (see pipeline.lake.storage.store). Empty
    # credentials: the AWS_* environment, profile or instance role.
    #: ``http(s)://host:port`` of an S3-compatible server ("" = AWS S3 itself).
    s3_endpoint: str = ""
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    #: Never shown: left out of ``repr`` (and so of every logged settings object).
    s3_secret_key: str = field(default="", repr=False)
    #: Path-style requests (``endpoint/bucket/key``), what most S3-compatible servers need.
    s3_path_style: bool = True
    #: Allow an ``http://`` endpoint (plain text: a test or a private network only).
    s3_allow_http: bool = False
    #: How commits stay safe with several writers: ``etag`` (S3 conditional puts, the
    #: default) or ``unsafe-rename`` (no protection: one writer at a time only).
    s3_conditional_put: str = "etag"
    #: Seconds one object-store request may take, and retries of a failed one: a store
    #: that is down fails a job in seconds, not after the client's default minutes.
    s3_timeout_s: int = 30
    s3_max_retries: int = 2

    def __post_init__(self) -> None:
        _check(self)
        if not self.uri:
            raise _invalid(self, "uri", "must not be empty")
        if self.archive_job_workers < 1:
            raise _invalid(
                self, "archive_job_workers", f"must be positive, got {self.archive_job_workers}"
            )
        if "://" not in self.uri or self.uri.startswith("file://"):
            path = Path(self.uri.removeprefix("file://")).expanduser().absolute()
            object.__setattr__(self, "uri", str(path))
        elif not self.uri.startswith(OBJECT_STORE_SCHEMES):
            raise _invalid(
                self, "uri", f"must be a local path or s3://bucket/prefix, got {self.uri!r}"
            )
        elif not urlparse(self.uri).netloc:
            raise _invalid(self, "uri", f"names no bucket: {self.uri!r}")
        if self.s3_conditional_put not in ("etag", "unsafe-rename"):
            raise _invalid(
                self,
                "s3_conditional_put",
                f"must be etag or unsafe-rename, got {self.s3_conditional_put!r}",
            )
        if self.s3_endpoint:
            scheme = urlparse(self.s3_endpoint).scheme
            if scheme not in ("http", "https"):
                raise _invalid(
                    self, "s3_endpoint", f"must be http(s)://host:port, got {self.s3_endpoint!r}"
                )
            if scheme == "http" and not self.s3_allow_http:
                raise _invalid(
                    self,
                    "s3_endpoint",
                    "is plain http: set lake_s3_allow_http (SLUICE_LAKE_S3_ALLOW_HTTP=true) "
                    "to allow it",
                )

    @property
    def min_retain_hours(self) -> int:
        """The least VACUUM retention that is safe beside running jobs, in whole hours.

        VACUUM (full mode) deletes files no commit references once older than
        the retention: an archive job's files are unreferenced until its commit,
        and a job may run up to ``job_timeout_s``.
        """
        return max(1, math.ceil(self.job_timeout_s / 3600))

    @property
    def remote(self) -> bool:
        """True when the lake is on object storage (``s3://``), not a local directory."""
        return self.uri.startswith(OBJECT_STORE_SCHEMES)

    def storage_options(self) -> dict[str, str]:
        """delta-rs (object_store) storage options of this lake; empty for a local lake.

        The one translation of the ``lake_s3_*`` settings: pyarrow's and Spark's
        are derived from it (:mod:`pipeline.lake.storage.store`). Holds the secret: never log it.
        """
        if not self.remote:
            return {}
        options = {
            "AWS_REGION": self.s3_region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if self.s3_path_style else "true",
            "AWS_ALLOW_HTTP": "true" if self.s3_allow_http else "false",
            "timeout": f"{self.s3_timeout_s}s",
            "connect_timeout": f"{min(self.s3_timeout_s, 10)}s",
            "max_retries": str(self.s3_max_retries),
            "retry_timeout": f"{self.s3_timeout_s}s",
        }
        if self.s3_conditional_put == "etag":
            options["AWS_CONDITIONAL_PUT"] = "etag"
        else:
            options["AWS_S3_ALLOW_UNSAFE_RENAME"] = "true"
        if self.s3_endpoint:
            options["AWS_ENDPOINT_URL"] = self.s3_endpoint
        if self.s3_access_key:
            options["AWS_ACCESS_KEY_ID"] = self.s3_access_key
            options["AWS_SECRET_ACCESS_KEY"] = self.s3_secret_key
        return options

    @classmethod
    def from_url(cls, url: str) -> LakeSettings:
        """The lake at ``url`` with every other lake setting at its default."""
        return cls(uri=url)

    def table(self, name: str) -> str:
        """The URI of one table under the lake root."""
        return f"{self.uri.rstrip('/')}/{name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SparkSettings:
    """How lake jobs reach Spark."""

    _SECTION: ClassVar[str] = "spark"

    master: str = "local[*]"
    #: ``sc://host:port`` of a Spark Connect server: lake jobs become thin clients ("" = local JVM).
    remote: str = ""
    #: Comma-separated Delta jar paths for the local one-JVM mode ("" = the cache ``make install`` wrote).
    jars: str = ""
    #: Heap of a local Spark driver (one-JVM mode and ``sluice spark``).
    driver_memory: str = "1g"
    #: Port ``sluice spark`` listens on.
    connect_port: Port = 15002
    shuffle_partitions: int = 4

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """A routing node (``sluice node``): its workers, TCP transport and stream service."""

    _SECTION: ClassVar[str] = "node"

    name: str = "node"
    workers: tuple[str, ...] = ("echo",)
    listen: Listen = ""
    #: TCP transport: most connections (in + out); at the bound the stalest inbound one is evicted.
    tcp_max_connections: int = 256
    #: Seconds a new inbound TCP connection has to complete its first Dialogue frame.
    tcp_first_frame_s: float = 10.0
    #: Seconds one Dialogue frame may take once its first byte arrived (cuts trickled frames).
    tcp_frame_s: float = 30.0
    #: A TCP connection with no byte either way and nothing outstanding is closed after this.
    tcp_idle_s: float = 300.0
    #: ``host:port`` of the node's ``/healthz`` and ``/metrics`` (empty: off).
    health_listen: Listen = ""
    #: Stream service: failed deliveries of one entry before its consumer is dropped.
    consumer_max_failures: int = _bare(3)
    #: Stream service: seconds a consumer lease lives without renewal.
    lease_ttl_s: int = _bare(15)
    #: Stream transport: seconds a message's push is retried (Redis away or refusing
    #: writes) before its sender is told it failed.
    send_timeout_s: float = 45.0

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class BusSettings:
    """The reliable message bus of one twin (``sluice bus``): every tunable and its default."""

    _SECTION: ClassVar[str] = "bus"

    twin: int = 0
    listen: Listen = "127.0.0.1:8051"
    directory: str = ""
    key_file: str = ""
    legacy_peers: bool = False
    #: ``host:port`` of the bus's ``/healthz`` and ``/metrics`` (empty: off).
    health_listen: Listen = ""
    #: ``exp`` 0 means this many seconds; larger ``exp`` values are capped at max_exp_s.
    default_exp_s: int = 300
    max_exp_s: int = 86400
    #: ``try`` is capped at this many retries; backoff doubles from base up to max.
    max_try: int = 16
    retry_base_s: float = 0.1
    retry_max_s: float = 2.0
    #: Signed bus-to-bus POSTs are accepted this far from the receiver's clock (replay window).
    replay_window_s: float = 300.0
    #: Request uids remembered against replays (then 503 until the window moves on).
    max_seen: int = 2_000_000
    #: Handling attempts of one message before it goes to ``msgbus.system.dead``.
    max_attempts: int = 3
    #: Inbound HTTP: a connection with no completed request for this long is closed.
    http_idle_s: float = 30.0
    #: Inbound HTTP connections open at once (more are closed on arrival).
    http_max_connections: int = 1024
    #: Most messages one queue loop takes from Redis per step.
    batch: int = 256
    #: Seconds between scans for expired and stranded messages.
    scrub_interval_s: float = 0.25
    #: Concurrent outbound POSTs to peers.
    http_workers: int = 128
    #: Messages waiting for an outbound POST before the queue loops stop taking more.
    max_pending: int = 10_000
    #: Size of the bus's Redis connection pool.
    redis_connections: int = 32

    def __post_init__(self) -> None:
        _check(self)
        if not self.listen:
            raise _invalid(self, "listen", "must be host:port, got ''")

    @property
    def host(self) -> str:
        """The host part of ``listen``."""
        return self.listen.rpartition(":")[0] or "127.0.0.1"

    @property
    def port(self) -> int:
        """The port part of ``listen`` (0: let the system pick)."""
        return int(self.listen.rpartition(":")[2])


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    """The resumption server (``sluice serve``)."""

    _SECTION: ClassVar[str] = "serve"

    host: str = "127.0.0.1"
    port: Port = 8765
    stream: str = "chain:demo"
    token: str = ""
    send_buffer: int = 4096
    heartbeat_s: float = 20.0
    #: TCP port of the same feed over Dialogue duplexes (0: off).
    dialogue_port: Port = 0
    #: Decoded lake history kept in memory (MiB, LRU by data file; 0: off).
    history_cache_mb: int = 512
    #: Seconds a cached history file may go unused before it is dropped (its memory given back).
    cache_idle_s: float = 60.0
    #: Seconds between two looks of the memory releaser (longer after fruitless releases).
    release_every_s: float = 10.0
    #: Redis tail entries indexed by block number (about 0.7 KB each); older ones come from the lake.
    tail_index_max: int = 500_000
    #: HTTP connections open at once (more: answered 503 and closed).
    max_connections: int = 1024
    #: Seconds a connection may take to send a complete request head (the websocket upgrade).
    header_timeout_s: float = 10.0
    #: Seconds a catching-up subscriber's full send buffer may stay full (then: closed, 1008).
    stall_s: float = 30.0

    def __post_init__(self) -> None:
        _check(self)
        for name in ("max_connections", "header_timeout_s", "cache_idle_s", "release_every_s"):
            if not getattr(self, name) > 0:
                raise _invalid(self, name, f"must be positive, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every setting of Sluice, one section per part. See the module docstring for names."""

    _SECTION: ClassVar[str] = ""

    redis: RedisSettings = field(default_factory=RedisSettings)
    lake: LakeSettings = field(default_factory=LakeSettings)
    spark: SparkSettings = field(default_factory=SparkSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    bus: BusSettings = field(default_factory=BusSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    var_dir: str = "./var"
    #: Largest routed message / frame / stream payload accepted, in bytes.
    max_payload: int = MAX_PAYLOAD
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        _check(self)
        if self.log_level.upper() not in LOG_LEVELS:
            raise _invalid(
                self,
                "log_level",
                f"must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}",
            )

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        *,
        parts: Collection[str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Build settings from ``sluice.toml``, then ``SLUICE_*``, then ``overrides``.

        ``overrides`` take flat names (``redis_url=...``, ``bus_twin=...``).
        ``parts`` (section names, e.g. ``("redis", "bus")``): read only those
        sections from the file and the environment, the others keep their
        defaults, so a bad value of a part a command does not use cannot stop
        it. Unknown names are refused either way, from the file or from a
        ``SLUICE_*`` variable alike; a config file named in ``SLUICE_CONFIG``
        must exist.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, value, source in _file_values(env, config_path):
            values[name] = value
            sources[name] = source
        for var, raw in env.items():
            flat = _env_setting(var)
            if flat is not None:
                values[flat] = raw
                sources[flat] = var
        if parts is not None:
            unused = [n for n in values if n in _FLAT and _FLAT[n][0] and _FLAT[n][0] not in parts]
            for name in unused:
                del values[name]
        for name, value in overrides.items():
            values[name] = value
            sources.pop(name, None)
        token = _SOURCES.set(sources)
        try:
            return _build(cls(), values)
        finally:
            _SOURCES.reset(token)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied: flat names (``serve_port=0``) or whole sections."""
        return _build(self, changes)


_SECTIONS: tuple[str, ...] = ("redis", "lake", "spark", "node", "bus", "serve")

#: While ``load`` builds settings: where each flat setting came from (for error messages).
_SOURCES: ContextVar[Mapping[str, str] | None] = ContextVar("_SOURCES", default=None)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a settings class (``Annotated`` kept)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return hints


def _flat_name(section: str, f: dataclasses.Field[Any]) -> str:
    if "flat" in f.metadata:  # a field named after a setting of another section
        return str(f.metadata["flat"])
    if not section or f.metadata.get("bare"):
        return f.name
    return f"{section}_{f.name}"


def _index() -> dict[str, tuple[str, str]]:
    """Flat name -> (section, field); section "" is the top level."""
    index: dict[str, tuple[str, str]] = {}
    for f in fields(Settings):
        if f.name in _SECTIONS:
            section_cls = _hints(Settings)[f.name]
            for g in fields(section_cls):
                index[_flat_name(f.name, g)] = (f.name, g.name)
        else:
            index[f.name] = ("", f.name)
    return index


def _invalid(obj: Any, name: str, problem: str) -> ConfigError:
    """The error for field ``name`` of section ``obj``, named as the user wrote it."""
    flat = _flat_name(obj._SECTION, next(f for f in fields(obj) if f.name == name))
    return _error(flat, problem)


def _error(flat: str, problem: str) -> ConfigError:
    return ConfigError(f"setting {flat!r}{_source(flat)} {problem}")


def _source(flat: str) -> str:
    source = (_SOURCES.get() or {}).get(flat)
    return f" (from {source})" if source else ""


def _check(obj: Any) -> None:
    """The checks every section shares, by field type: numbers, ports, listen addresses."""
    hints = _hints(type(obj))
    for f in fields(obj):
        hint = hints[f.name]
        base, rules = _unwrap(hint)
        value = getattr(obj, f.name)
        if base in (int, float):
            if not math.isfinite(value) or value < 0:
                raise _invalid(obj, f.name, f"must be a non-negative number, got {value}")
            if _Rule.PORT in rules and value > 65535:
                raise _invalid(obj, f.name, f"must be a TCP port (0-65535), got {value}")
        elif _Rule.LISTEN in rules and value:
            _, sep, port = str(value).rpartition(":")
            if not sep or not port.isdigit() or int(port) > 65535:
                raise _invalid(obj, f.name, f"must be host:port, got {value!r}")


def _unwrap(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    if typing.get_origin(hint) is Annotated:
        return hint.__origin__, hint.__metadata__
    return hint, ()


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _coerce(flat: str, hint: Any, value: Any) -> Any:
    """``value`` (text from the environment, TOML, or a Python value) as type ``hint``."""
    base, _ = _unwrap(hint)
    what = {int: "int", float: "float", bool: "bool", str: "text"}.get(base, "a list of text")
    bad = _error(flat, f"cannot read {value!r} as {what}")
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise bad
    if base is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int | str):
            try:
                return int(value)
            except ValueError:
                raise bad from None
        raise bad
    if base is float:
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if base is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise bad
    if typing.get_origin(base) is tuple:
        if isinstance(value, str):
            return _split(value)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise bad
    raise TypeError(f"settings: no coercion for {hint!r}")  # a field of a new type: add it


def _build(base: Settings, values: Mapping[str, Any]) -> Settings:
    """``base`` with ``values`` (flat names, or whole sections by name) applied and checked."""
    top: dict[str, Any] = {}
    per_section: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    for flat, value in values.items():
        if flat in _SECTIONS:
            section_cls = _hints(Settings)[flat]
            if not isinstance(value, section_cls):
                raise ConfigError(f"setting {flat!r} must be a {section_cls.__name__}")
            top[flat] = value
            continue
        where = _FLAT.get(flat)
        if where is None:
            raise ConfigError(f"unknown setting {flat!r}{_source(flat)}")
        section, name = where
        if section:
            hint = _hints(_hints(Settings)[section])[name]
            per_section[section][name] = _coerce(flat, hint, value)
        else:
            top[name] = _coerce(flat, _hints(Settings)[name], value)
    for section, changes in per_section.items():
        if changes:
            current = top.get(section, getattr(base, section))
            top[section] = dataclasses.replace(current, **changes)
    return dataclasses.replace(base, **top) if top else base


def _file_values(
    env: Mapping[str, str], config_path: str | os.PathLike[str] | None
) -> list[tuple[str, Any, str]]:
    """``(flat name, value, path)`` of the config file's settings.

    A ``config_path`` or the default ``./sluice.toml`` may be absent ("no
    config file"); a file a user named in ``SLUICE_CONFIG`` must exist.
    """
    named = None if config_path else env.get(_PREFIX + "CONFIG")
    path = Path(config_path or named or "sluice.toml")
    if not path.exists():
        if named:
            raise ConfigError(f"config file {path} (from {_PREFIX}CONFIG) does not exist")
        return []
    return [(name, value, str(path)) for name, value in _read_toml(path).items()]


#: ``SLUICE_*`` variables that are not settings: read by scripts, tests, the demo.
NOT_SETTINGS = (
    "CONFIG",
    "BUS_URL",
    "DEMO_ID",
    "CHROMIUM",
    "GO_CACHE",
    "VERSITYGW_CACHE",
    "SECRETS_DIR",
    "POSTGRES_PASSWORD",
    "SOAK_S",
    "CARDINAL_FEED_S",
)
#: Prefixes (after ``SLUICE_``) of variables that are not settings.
NOT_SETTINGS_PREFIXES = ("TEST_", "BENCH_")


def _env_setting(var: str) -> str | None:
    """The flat setting ``SLUICE_*`` variable ``var`` sets; None when it is not one of ours.

    An unknown ``SLUICE_*`` name is returned as is, so building refuses it the
    way it refuses an unknown key of ``sluice.toml``.
    """
    if not var.startswith(_PREFIX):
        return None
    rest = var[len(_PREFIX) :]
    if rest in NOT_SETTINGS or rest.startswith(NOT_SETTINGS_PREFIXES) or not rest:
        return None
    return rest.lower()


def _read_toml(path: Path) -> dict[str, Any]:
    """The ``[sluice]`` table of ``path`` as flat names (``[sluice.bus]`` tables flattened)."""
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
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if key in _SECTIONS and isinstance(value, dict):
            section_cls = _hints(Settings)[key]
            names = {g.name: _flat_name(key, g) for g in fields(section_cls)}
            for name, item in value.items():
                if name not in names:
                    raise ConfigError(f"{path}: unknown setting {name!r} in [sluice.{key}]")
                flat[names[name]] = item
        else:
            flat[key] = value
    return flat


#: Flat name -> (section, field name) for every setting.
_FLAT: dict[str, tuple[str, str]] = _index()


def flat_names() -> tuple[str, ...]:
    """Every flat setting name (``SLUICE_`` + its upper case is the environment variable)."""
    return tuple(_FLAT)


__all__ = [
    "MAX_PAYLOAD",
    "BusSettings",
    "LakeSettings",
    "NodeSettings",
    "RedisSettings",
    "ServeSettings",
    "Settings",
    "SparkSettings",
    "flat_names",
]
