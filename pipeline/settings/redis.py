"""The ``redis`` section: where Redis is, and how many replicas a write waits for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.errors import ConfigError
from pipeline.redisio import url as redisurl
from pipeline.settings.fields import check, flat_of, invalid


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
        check(self)
        try:
            redisurl.parse(self.url)
        except ConfigError as exc:
            raise invalid(self, "url", str(exc)) from None
        # WAIT with a timeout of 0 blocks until enough replicas answer: maybe forever.
        if self.min_replicas and not self.min_replicas_timeout_ms:
            raise invalid(
                self,
                "min_replicas_timeout_ms",
                f"must be positive when {flat_of(self, 'min_replicas')} is set "
                "(0 would wait for the replicas forever)",
            )

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
