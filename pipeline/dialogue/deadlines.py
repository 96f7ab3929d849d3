"""A heap of deadlines with lazy deletion, for the Dialogue machine (which has no clock).

Entries are never removed when the thing they time out completes; instead the
owner's ``is_live`` predicate says whether an entry still matters, and the
heap drops dead entries when they surface or when they outnumber live ones
(so answered requests never accumulate).
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field


class DeadlineKind(enum.Enum):
    """What a deadline times out."""

    #: Our request: cancel it and report it timed out.
    REQUEST = "request"
    #: A duplex we opened and ended: stop waiting for the peer's end.
    DUPLEX = "duplex"
    #: The close exchange: end the dialogue.
    CLOSE = "close"


@dataclass(order=True, slots=True)
class Deadline:
    when: float
    kind: DeadlineKind = field(compare=False)
    id: int = field(compare=False)


class Deadlines:
    __slots__ = ("_heap", "_is_live")

    def __init__(self, is_live: Callable[[Deadline], bool]) -> None:
        self._heap: list[Deadline] = []
        self._is_live = is_live

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, when: float, kind: DeadlineKind, pid: int, live: int) -> None:
        """Push one deadline; ``live`` is how many entries can be live at most."""
        heap = self._heap
        heapq.heappush(heap, Deadline(when, kind, pid))
        if len(heap) > 2 * live + 64:
            self._heap = [d for d in heap if self._is_live(d)]
            heapq.heapify(self._heap)

    def next(self) -> float | None:
        """The earliest live deadline, or None."""
        heap = self._heap
        while heap and not self._is_live(heap[0]):
            heapq.heappop(heap)
        return heap[0].when if heap else None

    def pop_due(self, now: float) -> Deadline | None:
        """Remove and return the earliest live deadline at or before ``now``, else None."""
        heap = self._heap
        while heap and heap[0].when <= now:
            item = heapq.heappop(heap)
            if self._is_live(item):
                return item
        return None

    def clear(self) -> None:
        self._heap.clear()
