"""The ``node`` section: a routing node's workers, TCP transport and stream service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.settings.fields import Listen, Names, NonEmpty, PositiveInt, bare, check


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """A routing node (``sluice node``): its workers, TCP transport and stream service."""

    _SECTION: ClassVar[str] = "node"

    name: NonEmpty = "node"
    workers: Names = ("echo",)
    listen: Listen = ""
    #: TCP transport: most connections (in + out); at the bound the stalest inbound one is evicted.
    tcp_max_connections: PositiveInt = 256
    #: Seconds a new inbound TCP connection has to complete its first Dialogue frame (0: no limit).
    tcp_first_frame_s: float = 10.0
    #: Seconds one Dialogue frame may take once its first byte arrived (cuts trickled frames;
    #: 0: no limit).
    tcp_frame_s: float = 30.0
    #: A TCP connection with no byte either way and nothing outstanding is closed after this
    #: (0: never).
    tcp_idle_s: float = 300.0
    #: ``host:port`` of the node's ``/healthz`` and ``/metrics`` (empty: off).
    health_listen: Listen = ""
    #: Stream service: failed deliveries of one entry before its consumer is dropped.
    consumer_max_failures: PositiveInt = bare(3)
    #: Stream service: seconds a consumer lease lives without renewal.
    lease_ttl_s: PositiveInt = bare(15)
    #: Stream transport: seconds a message's push is retried (Redis away or refusing
    #: writes) before its sender is told it failed.
    send_timeout_s: float = 45.0

    def __post_init__(self) -> None:
        check(self)
