"""How long the demo waits for a starting component: as long as it makes progress, within a limit.

Theory of operation. A component has its own start deadline, what it takes on
a quiet machine (``base_s``: Airflow 300 s, Spark 240 s, ...). On a loaded
machine a component can be well on its way when that passes (Airflow at load
50 gave up at 300 s while still migrating and starting its parts), so the
deadline is not a wall: past ``base_s`` the demo keeps waiting while the
component makes progress, and gives up only when it made none for ``stall_s``
seconds, or when ``limit_s`` (``sluice demo --start-timeout``) has passed
since it started, whichever comes first.

Progress is what the supervisor measures of the component from outside
(:meth:`Patience.sample`): its log grew, or its processes (the whole tree,
children that already exited included) used at least :data:`MIN_CPU_S` of
CPU since the last progress seen. A process blocked on a port or a lock
shows neither; one that spins forever is stopped by ``limit_s``.

No I/O and no clock of its own: the caller passes ``now`` (monotonic
seconds), which keeps every rule testable by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: CPU seconds a component's processes must use to count as progress without new log output.
MIN_CPU_S = 0.2
#: Seconds without progress, past the component's own deadline, before the demo gives up.
STALL_S = 180.0
#: Seconds between two "still waiting" lines.
NOTE_EVERY_S = 60.0


@dataclass(slots=True)
class Patience:
    """One start of one component: when to give up on it, and what to say while waiting."""

    started: float
    #: the component's own deadline on a quiet machine (seconds after ``started``)
    base_s: float
    #: never wait longer than this, progress or not
    limit_s: float
    stall_s: float = STALL_S
    #: when progress was last seen, and the log size and CPU seconds then
    last_progress: float = field(init=False)
    _mark: tuple[int, float] | None = field(init=False, default=None)
    #: the log size and CPU seconds at the last note (what the next note reports as growth)
    _noted: tuple[float, int, float] | None = field(init=False, default=None)
    _next_note: float = field(init=False)

    def __post_init__(self) -> None:
        if min(self.base_s, self.stall_s, self.limit_s) <= 0:
            raise ValueError("base_s, stall_s and limit_s must be positive")
        self.base_s = min(self.base_s, self.limit_s)
        self.last_progress = self.started
        self._next_note = self.started + self.base_s

    def sample(self, now: float, log_bytes: int, cpu_s: float) -> None:
        """What the component shows now: its log's size and its processes' CPU seconds."""
        if self._mark is None:
            self._mark = (log_bytes, cpu_s)
            self._noted = (now, log_bytes, cpu_s)
            return
        logged, used = self._mark
        if log_bytes > logged or cpu_s - used >= MIN_CPU_S:
            self.last_progress = now
            self._mark = (log_bytes, cpu_s)

    def give_up(self, now: float) -> str | None:
        """None while the demo keeps waiting; else why it gives up (one line, after "not ready")."""
        waited = now - self.started
        if waited >= self.limit_s:
            return f"within the start limit of {self.limit_s:g}s (--start-timeout)"
        if waited < self.base_s:
            return None
        idle = now - self.last_progress
        if idle >= self.stall_s:
            return f"within {self.base_s:g}s, and no progress for {idle:.0f}s"
        return None

    def note(self, now: float, log_bytes: int, cpu_s: float) -> str | None:
        """Past the component's own deadline, every :data:`NOTE_EVERY_S`: what it did since
        the last note (None when no note is due)."""
        if now < self._next_note:
            return None
        self._next_note = now + NOTE_EVERY_S
        since, logged, used = self._noted if self._noted is not None else (now, log_bytes, cpu_s)
        self._noted = (now, log_bytes, cpu_s)
        window = max(now - since, 0.0)
        return (
            f"still starting after {now - self.started:.0f}s, making progress (in the last "
            f"{window:.0f}s: {max(cpu_s - used, 0.0):.1f} CPU-s, "
            f"{max(log_bytes - logged, 0) / 1024:.1f} KiB of log); waiting while it does, "
            f"for at most {self.limit_s - (now - self.started):.0f}s more"
        )


__all__ = ["MIN_CPU_S", "NOTE_EVERY_S", "STALL_S", "Patience"]
