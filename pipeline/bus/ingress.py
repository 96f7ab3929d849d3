"""What the bus's HTTP endpoints (:mod:`pipeline.bus.http`) share: :class:`Ingress`.

The settings they judge a POST by, where they write it, what they count for
``/metrics``, whom they tell about matched replies, and the one log gate of
their Redis failures: while Redis is away every POST is answered 503, and
the log says so once per interval (with the count suppressed), not once per
POST, then once when Redis works again.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.bus.config import BusConfig
from pipeline.bus.directory import Directory
from pipeline.bus.store import BusStore
from pipeline.loggate import LogGate
from pipeline.redisio import conn as redisconn

log = logging.getLogger("pipeline.bus.http")

#: Told the uids of the requests whose replies were matched (their callers answered).
Answered = Callable[[list[str]], None]


def _gate() -> LogGate:
    return LogGate(log)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ingress:
    """What the endpoints need to judge an incoming envelope."""

    twin: int
    directory: Directory
    store: BusStore
    legacy_peers: bool
    default_exp: int
    max_exp: int
    max_size: int
    replay_window_s: float = 300.0
    idle_s: float = 30.0
    max_connections: int = 1024
    #: What the endpoints count beyond the outcomes (``slow_bodies``), for ``/metrics``.
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Called with the uids of the requests whose replies were matched.
    answered: Answered | None = None
    #: The one gate of the endpoints' Redis failures (see the module docstring).
    gate: LogGate = field(default_factory=_gate)

    @classmethod
    def from_config(
        cls,
        config: BusConfig,
        directory: Directory,
        store: BusStore,
        answered: Answered | None = None,
    ) -> Ingress:
        """What the HTTP endpoints need, from a bus's config."""
        return cls(
            twin=config.twin,
            directory=directory,
            store=store,
            legacy_peers=config.legacy_peers,
            default_exp=config.default_exp_s,
            max_exp=config.max_exp_s,
            max_size=config.max_size,
            replay_window_s=config.replay_window_s,
            idle_s=config.http_idle_s,
            max_connections=config.http_max_connections,
            answered=answered,
        )

    def redis_failed(self, exc: BaseException) -> None:
        """Log a Redis failure behind a 503: through the gate when Redis is away or
        refusing writes (the peer retries; a line per POST says nothing more), with its
        traceback otherwise. Counted in ``counts["redis_errors"]``."""
        self.counts["redis_errors"] += 1
        if redisconn.unavailable(exc):
            self.gate.failed("redis", "bus: redis unavailable, answering 503: %r", exc)
        else:
            log.exception("bus: redis failed, answering 503")

    def redis_works(self) -> None:
        """A Redis step of an endpoint succeeded: one line if it had been failing."""
        self.gate.ended("redis", "bus: redis works again, POSTs taken")
