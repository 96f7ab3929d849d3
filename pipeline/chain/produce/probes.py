"""What ``sluice produce``'s writes went through: its ``/healthz`` check and ``/metrics`` samples.

A :class:`WriteRecord` is told each Redis call of the producer that failed
(:meth:`~WriteRecord.failed`) and each that went through
(:meth:`~WriteRecord.succeeded`). It counts them for ``/metrics`` (blocks
written, attempts retried, failures by kind, outages begun and ridden out) and
holds the outage under way, which :meth:`~WriteRecord.check` reports on
``/healthz`` with its cause until a write goes through again. No I/O here: the
health server (:mod:`pipeline.runtime.health`) serves both.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from pipeline.errors import RedisUnavailable
from pipeline.redisio.errorkind import KINDS, error_kind
from pipeline.runtime.health import Sample

PREFIX = "sluice_produce"


class WriteRecord:
    """Counts of the producer's Redis calls, and the outage under way if any."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: blocks appended to the stream (the blocks of reorg branches too)
        self.written = 0
        #: failed attempts that were retried
        self.retries = 0
        #: failed attempts by :func:`~pipeline.redisio.errorkind.error_kind`
        self.errors: Counter[str] = Counter()
        #: outages begun (a call failed after the previous one went through)
        self.outages = 0
        #: outages ended by the call going through at last
        self.ridden_out = 0
        self._since: float | None = None
        self._doing = ""
        self._cause = ""

    @property
    def failing_s(self) -> float:
        """Seconds the outage under way has lasted (0.0 when none is)."""
        return 0.0 if self._since is None else self._clock() - self._since

    def failed(self, exc: BaseException, doing: str) -> float:
        """One attempt at ``doing`` (e.g. ``writing block 7``) failed with ``exc``, to be
        retried: counted; the seconds the outage has lasted (0.0 if it begins now)."""
        self.retries += 1
        self.errors[error_kind(exc)] += 1
        now = self._clock()
        if self._since is None:
            self._since = now
            self.outages += 1
        self._doing = doing
        self._cause = f"{type(exc).__name__}: {exc}"[:200]
        return now - self._since

    def succeeded(self) -> bool:
        """A call went through; True when it ended an outage."""
        if self._since is None:
            return False
        self._since = None
        self.ridden_out += 1
        return True

    async def check(self) -> None:
        """The ``/healthz`` check ``writes``: raises while an outage is under way, with its cause."""
        if self._since is not None:
            raise RedisUnavailable(
                f"{self._doing} has failed for {self.failing_s:.1f}s, retrying: {self._cause}"
            )


def samples(record: WriteRecord, reorgs: int, head: int | None) -> list[Sample]:
    """``/metrics`` of ``sluice produce``, beyond the health server's own."""
    out = [
        Sample(
            name="sluice_produce_blocks_written_total",
            value=record.written,
            kind="counter",
            help="blocks appended to the chain stream (those of reorg branches too)",
        ),
        Sample(
            name="sluice_produce_reorgs_total",
            value=reorgs,
            kind="counter",
            help="reorgs produced (each replaces blocks below the head)",
        ),
        Sample(
            name="sluice_produce_retries_total",
            value=record.retries,
            kind="counter",
            help="redis calls of the producer retried after failing",
        ),
        Sample(
            name="sluice_produce_outages_total",
            value=record.outages,
            kind="counter",
            help="times redis became unavailable or refused the producer's writes",
        ),
        Sample(
            name="sluice_produce_outages_ridden_out_total",
            value=record.ridden_out,
            kind="counter",
            help="outages ended by the call going through at last, nothing lost or repeated",
        ),
        Sample(
            name="sluice_produce_failing_seconds",
            value=round(record.failing_s, 3),
            help="seconds the redis outage under way has lasted (0: none)",
        ),
    ]
    out.extend(
        Sample(
            name="sluice_produce_redis_errors_total",
            value=record.errors[kind],
            kind="counter",
            labels={"kind": kind},
            help="failed redis calls of the producer, by kind",
        )
        for kind in KINDS
    )
    if head is not None:
        out.append(
            Sample(name="sluice_produce_head_block", value=head, help="the chain's head block")
        )
    return out


__all__ = ["PREFIX", "WriteRecord", "samples"]
