"""The checker: what one consumer applied, against the model's heaviest chain.

A consumer's record is its updates in arrival order, each an add
``(num, hash, parent)`` or a remove ``(num, hash)`` with the time it arrived
(adapters turn each dialect's reorg signal into removes:
:mod:`tests.history.consumers`). Applied in order they must never add a block
twice, add over another block without removing it first (a missed removal),
add a block whose parent is not the block below (a gap or a broken link),
or remove a block they do not hold; at the end the chain must be contiguous,
reach the model's head and equal the model's heaviest chain at every height,
from at most the height the consumer asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Update:
    t: float
    added: bool
    num: int
    hash: str
    parent: str = ""


@dataclass(slots=True)
class Record:
    """One consumer's updates, and what it asked for."""

    name: str
    kind: str
    dialect: str
    start: int
    updates: list[Update] = field(default_factory=list)
    #: when it joined (loop time): reorgs before it are not its to see live
    joined: float = 0.0

    def add(self, t: float, num: int, hash: str, parent: str) -> None:
        self.updates.append(Update(t, True, num, hash, parent))

    def remove(self, t: float, num: int, hash: str) -> None:
        self.updates.append(Update(t, False, num, hash))

    def first_seen(self, hash: str) -> float | None:
        return next((u.t for u in self.updates if u.added and u.hash == hash), None)


def apply(record: Record) -> tuple[dict[int, str], list[str]]:
    """The record applied in order: the final chain, and every violation met on the way."""
    state: dict[int, str] = {}
    bad: list[str] = []
    by_height = record.kind == "go"
    for u in record.updates:
        if not u.added:
            if state.get(u.num) != u.hash:
                bad.append(f"removed {u.num}:{u.hash[:8]} it does not hold")
            else:
                del state[u.num]
            continue
        held = state.get(u.num)
        if by_height:
            state[u.num] = u.hash
            continue
        if held == u.hash:
            bad.append(f"duplicate {u.num}:{u.hash[:8]}")
            continue
        if held is not None:
            bad.append(f"missed removal: {u.num}:{held[:8]} replaced by {u.hash[:8]} unremoved")
        below = state.get(u.num - 1)
        if state and below is not None and u.parent and below != u.parent:
            bad.append(f"broken link: {u.num}:{u.hash[:8]} on {u.parent[:8]}, holds {below[:8]}")
        elif state and below is None and u.num - 1 >= min(state):
            bad.append(f"gap: {u.num} added with nothing at {u.num - 1}")
        state[u.num] = u.hash
    return state, bad


def check(record: Record, chain: dict[int, str]) -> list[str]:
    """Every violation of one consumer against the model's final chain (empty: it holds)."""
    state, bad = apply(record)
    head = max(chain)
    if record.start > head:
        # asked (a wrong hash's rewind) above the heaviest chain's head: as the seed says,
        # it waits for blocks from there; nothing is owed to it yet
        return bad
    if not state:
        return [*bad, "applied nothing"]
    low, high = min(state), max(state)
    if low > record.start:
        bad.append(f"starts at {low}, above the {record.start} it asked for")
    holes = [n for n in range(low, high + 1) if n not in state]
    if holes:
        bad.append(f"{len(holes)} holes, first {holes[:5]}")
    if high != head:
        bad.append(f"ends at {high}, the heaviest chain at {head}")
    stale = [n for n in sorted(state) if chain.get(n) != state[n]]
    if stale:
        bad.append(f"{len(stale)} stale heights (not the heaviest chain's), first {stale[:5]}")
    return bad


__all__ = ["Record", "Update", "apply", "check"]
