"""The ``bus`` section: every tunable of one twin of the reliable message bus."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.settings.fields import Listen, PositiveFloat, PositiveInt, check, flat_of, invalid


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
    default_exp_s: PositiveInt = 300
    max_exp_s: PositiveInt = 86400
    #: ``try`` is capped at this many retries; backoff doubles from base up to max.
    max_try: int = 16
    retry_base_s: PositiveFloat = 0.1
    retry_max_s: PositiveFloat = 2.0
    #: Signed bus-to-bus POSTs are accepted this far from the receiver's clock (replay window).
    replay_window_s: PositiveFloat = 300.0
    #: Request uids remembered against replays (then 503 until the window moves on).
    max_seen: PositiveInt = 2_000_000
    #: Handling attempts of one message before it goes to ``msgbus.system.dead``.
    max_attempts: PositiveInt = 3
    #: Inbound HTTP: a connection with no completed request for this long is closed.
    http_idle_s: PositiveFloat = 30.0
    #: Inbound HTTP connections open at once (more are closed on arrival).
    http_max_connections: PositiveInt = 1024
    #: Most messages one queue loop takes from Redis per step.
    batch: PositiveInt = 256
    #: Seconds between scans for expired and stranded messages.
    scrub_interval_s: PositiveFloat = 0.25
    #: Concurrent outbound POSTs to peers.
    http_workers: PositiveInt = 128
    #: Messages waiting for an outbound POST before the queue loops stop taking more.
    max_pending: PositiveInt = 10_000
    #: Size of the bus's Redis connection pool.
    redis_connections: PositiveInt = 32
    #: The twin's lease: a standby takes over this long after the active bus stopped renewing.
    twin_lease_s: PositiveFloat = 4.0

    def __post_init__(self) -> None:
        check(self)
        if not self.listen:
            raise invalid(self, "listen", "must be host:port, got ''")
        # A default above its cap, a base above its ceiling: the smaller one silently wins.
        for low, high in (("default_exp_s", "max_exp_s"), ("retry_base_s", "retry_max_s")):
            if getattr(self, low) > getattr(self, high):
                raise invalid(
                    self,
                    low,
                    f"must not exceed {flat_of(self, high)} ({getattr(self, high)}), "
                    f"got {getattr(self, low)}",
                )

    @property
    def host(self) -> str:
        """The host part of ``listen``."""
        return self.listen.rpartition(":")[0] or "127.0.0.1"

    @property
    def port(self) -> int:
        """The port part of ``listen`` (0: let the system pick)."""
        return int(self.listen.rpartition(":")[2])
