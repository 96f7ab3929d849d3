"""What a bus's sender knows of each peer: whether it answers, since when, and when
the next POST may go to one that does not.

A peer whose last POST got no answer (every item of it unreachable, or sent
with no answer) is *down* until a POST to it is answered. While it is down the
sender sends it one POST at a time, a *probe* carrying what waits for it, and
spaces the probes by :meth:`PeerBook.probe_delay`: doubling from the retry
base, capped at the retry cap, each jittered down by up to half so that peers
and buses that failed together do not retry in step. A dead peer thus costs a
connection attempt every second or two, however many items wait for it (not
one per item: 15,784 attempts for about 357 requests in 3 minutes before);
the items keep their own deadlines.

Pure: no I/O, the clocks and the random source injected.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.bus.outbound import Judged, Outcome

#: A peer whose last failed POST is older than this no longer counts as unreachable.
STALE_S = 60.0
#: Peers remembered as down at most (the oldest is forgotten first).
MAX_DOWN = 10_000


@dataclass(slots=True)
class _Down:
    since: float  # epoch seconds of the first unanswered POST
    last: float  # epoch seconds of the latest one
    probes: int = 0  # unanswered probes
    due: float = 0.0  # monotonic seconds: when the next POST may go


class PeerBook:
    """Per-peer reachability, for ``/healthz``, ``/metrics`` and the spacing of probes."""

    def __init__(
        self,
        *,
        base_s: float,
        cap_s: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._base = base_s
        self._cap = cap_s
        self._clock = clock
        self._monotonic = monotonic
        self._jitter = jitter
        self._down: dict[int, _Down] = {}

    def backoff(self, attempt: int) -> float:
        """Seconds before retry ``attempt`` (from 0): doubling from the base, capped."""
        return float(min(self._cap, self._base * (2 ** min(attempt, 30))))

    def probe_delay(self, probes: int) -> float:
        """Seconds before the next POST to a peer after ``probes`` unanswered ones:
        :meth:`backoff`, jittered down by up to half."""
        return self.backoff(probes) * (0.5 + self._jitter() / 2)

    def wait_s(self, twin: int) -> float | None:
        """None while ``twin`` answers (no limit); else seconds until its next probe
        may go (0 or less: now; one at a time)."""
        down = self._down.get(twin)
        return None if down is None else down.due - self._monotonic()

    def noted(self, twin: int, heard: list[Judged]) -> tuple[str, float] | None:
        """Learn from the outcomes of the items one POST carried ([]: none went, nothing
        learned). Returns ``("down", 0.0)`` when ``twin`` just stopped answering, ``("up",
        seconds it was down)`` when it answers again, else None."""
        if not heard:
            return None
        now = self._clock()
        if any(o not in (Outcome.UNREACHABLE, Outcome.UNKNOWN) for o, _ in heard):
            down = self._down.pop(twin, None)
            return None if down is None else ("up", now - down.since)
        down = self._down.get(twin)
        first = down is None
        if down is None:
            if len(self._down) >= MAX_DOWN:
                del self._down[next(iter(self._down))]
            down = self._down[twin] = _Down(since=now, last=now)
        down.last = now
        moment = self._monotonic()
        if moment >= down.due:  # (POSTs that left before it was known down are no probes)
            down.due = moment + self.probe_delay(down.probes)
            down.probes += 1
        return ("down", 0.0) if first else None

    def unreachable(self) -> dict[int, float]:
        """Peers that answer no POST now, with the seconds since they stopped answering.

        A peer counts while a POST to it failed in the last :data:`STALE_S`
        (with nothing left to send to it, nothing more is known about it).
        """
        now = self._clock()
        return {
            twin: now - down.since
            for twin, down in self._down.items()
            if now - down.last <= STALE_S
        }
