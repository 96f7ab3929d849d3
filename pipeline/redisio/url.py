"""Where Redis is, parsed from one URL: a single server, a Sentinel-watched master, or a Cluster.

Pure parsing, no I/O (the clients are built by :mod:`pipeline.redisio.conn`). The forms:

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS), ``unix:///path?db=N``:
  one server, as before;
- ``redis+sentinel://[[user]:password@]host1[:port1],host2[:port2]/service[/db]``: the master
  of ``service`` as the listed Sentinels (default port 26379) know it; it follows a failover.
  ``rediss+sentinel://`` speaks TLS to the Sentinels and to the master. The password is the
  data nodes'; Sentinels that need one of their own take ``?sentinel_password=...``;
- ``redis+cluster://[[user]:password@]host1[:port1][,host2[:port2]...]``: a Redis Cluster
  reached through any of the listed nodes (the client learns the others); ``rediss+cluster://``
  keeps TLS. A cluster has only database 0.

Every malformed URL is one :class:`~pipeline.errors.ConfigError` line naming what is wrong.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlparse

from pipeline.errors import ConfigError

SENTINEL_PORT = 26379
REDIS_PORT = 6379


class Topology(enum.Enum):
    """How the Redis behind a URL is laid out."""

    SINGLE = "single"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": (Topology.SINGLE, False),
    "rediss": (Topology.SINGLE, True),
    "unix": (Topology.SINGLE, False),
    "redis+sentinel": (Topology.SENTINEL, False),
    "rediss+sentinel": (Topology.SENTINEL, True),
    "redis+cluster": (Topology.CLUSTER, False),
    "rediss+cluster": (Topology.CLUSTER, True),
}

#: The forms, for error messages.
FORMS = (
    "redis://host:port/db, rediss://..., unix:///path, "
    "redis+sentinel://host:port,host:port/service[/db] or redis+cluster://host:port[,host:port]"
)


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """One parsed Redis URL. ``hosts`` are the server (single), the Sentinels, or the seed
    nodes of a cluster; ``service`` is the Sentinel service name."""

    topology: Topology
    url: str
    hosts: tuple[tuple[str, int], ...]
    tls: bool = False
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    @property
    def safe_url(self) -> str:
        """The URL without its passwords (for logs and error messages)."""
        return redact(self.url)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    query = ""
    if "sentinel_password=" in tail:
        tail, _, query = tail.partition("?")
        query = "?" + "&".join(
            ("sentinel_password=***" if q.startswith("sentinel_password=") else q)
            for q in query.split("&")
        )
    return f"{scheme}://{userinfo}{at}{hosts}{slash}{tail}{query}"


def _hostport(text: str, default_port: int, url: str) -> tuple[str, int]:
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ConfigError(f"redis URL has an empty host in {redact(url)!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ConfigError(f"redis URL has a bad port {port_text!r} in {redact(url)!r}")
    return host, int(port_text)


def _db(text: str, url: str) -> int:
    if not (text or "0").isdigit():
        raise ConfigError(f"the redis db must be a number, got {text!r} in {redact(url)!r}")
    return int(text or "0")


def parse(url: str) -> RedisTarget:
    """The target ``url`` names; :class:`ConfigError` (one line) when it is not one of :data:`FORMS`."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ConfigError(f"not a redis URL ({FORMS}): {redact(url)!r}")
    topology, tls = SCHEMES[scheme.lower()]
    if topology is Topology.SINGLE:
        return _single(url, tls)
    location, _, query_text = rest.partition("?")
    netloc, _, path = location.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    default_port = SENTINEL_PORT if topology is Topology.SENTINEL else REDIS_PORT
    hosts = tuple(_hostport(h.strip(), default_port, url) for h in hostlist.split(","))
    query = {k: v[-1] for k, v in parse_qs(query_text).items()}
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)} in redis URL {redact(url)!r}")
    parts = [p for p in path.split("/") if p]
    if topology is Topology.CLUSTER:
        if query:
            raise ConfigError(f"sentinel_password is for Sentinel URLs: {redact(url)!r}")
        if len(parts) > 1 or _db(parts[0] if parts else "", url) != 0:
            raise ConfigError(f"a Redis Cluster has only database 0: {redact(url)!r}")
        return RedisTarget(topology, url, hosts, tls=tls, username=username, password=password)
    if not parts or len(parts) > 2:
        raise ConfigError(
            f"a Sentinel URL names its service: redis+sentinel://host:port,.../service[/db], "
            f"got {redact(url)!r}"
        )
    return RedisTarget(
        topology,
        url,
        hosts,
        tls=tls,
        service=unquote(parts[0]),
        db=_db(parts[1] if len(parts) > 1 else "", url),
        username=username,
        password=password,
        sentinel_password=query.get("sentinel_password"),
    )


def _single(url: str, tls: bool) -> RedisTarget:
    parsed = urlparse(url)
    if "," in parsed.netloc:
        raise ConfigError(
            f"several hosts need redis+sentinel:// or redis+cluster://, got {redact(url)!r}"
        )
    if parsed.scheme == "unix":
        db_text = parse_qs(parsed.query).get("db", ["0"])[0]
        return RedisTarget(Topology.SINGLE, url, ((parsed.path, 0),), db=_db(db_text, url))
    try:
        port = parsed.port or REDIS_PORT
    except ValueError as exc:
        raise ConfigError(f"not a Redis URL ({exc}): {redact(url)!r}") from exc
    return RedisTarget(
        Topology.SINGLE,
        url,
        ((parsed.hostname or "127.0.0.1", port),),
        tls=tls,
        db=_db(parsed.path.lstrip("/"), url),
        username=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password else None,
    )


__all__ = ["FORMS", "SCHEMES", "RedisTarget", "Topology", "parse", "redact"]
