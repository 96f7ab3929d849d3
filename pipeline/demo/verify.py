"""The check's yardsticks, pure: the canonical chain of a set of blocks, a subscriber's chain.

:func:`canonical_chain` is the heaviest chain of the blocks known to the
lake and Redis together (fork choice by ``effective_weight``, ties to the
block seen first, as a server that replaces its head only on a strictly
heavier block does). :class:`Follower` applies a subscriber's updates and
records every break of "each canonical block exactly once, in order": an
added block that does not extend the current tip, a removal of anything but
the tip.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.blockcodec import effective_weight
from pipeline.chain.client.ordered import Added, ChainUpdate, Removed
from pipeline.errors import BrokenChain

#: Violations kept in full (the count goes on).
MAX_PROBLEMS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class Known:
    """What the check needs of one block."""

    num: int
    hash: bytes
    parent: bytes
    weight: int | None = None


def canonical_chain(blocks: Iterable[Known]) -> list[Known]:
    """The heaviest chain, block 0 first; :class:`BrokenChain` if a parent is missing."""
    by_hash: dict[bytes, Known] = {}
    head: Known | None = None
    for block in blocks:
        if block.hash in by_hash:
            continue
        by_hash[block.hash] = block
        if head is None or effective_weight(block.num, block.weight) > effective_weight(
            head.num, head.weight
        ):
            head = block
    chain: list[Known] = []
    at = head
    while at is not None:
        chain.append(at)
        if at.num == 0:
            break
        parent = by_hash.get(at.parent)
        if parent is None or parent.num != at.num - 1:
            raise BrokenChain(f"block {at.num} 0x{at.hash.hex()[:12]}: parent not found")
        at = parent
    chain.reverse()
    if chain and chain[0].num != 0:
        raise BrokenChain(f"the chain starts at {chain[0].num}, not 0")
    return chain


@dataclass(slots=True)
class Follower:
    """A subscriber's view of the chain, built from its updates, with what went wrong."""

    chain: list[tuple[int, bytes]] = field(default_factory=list)
    added: int = 0
    removed: int = 0
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0

    @property
    def head(self) -> tuple[int, bytes] | None:
        return self.chain[-1] if self.chain else None

    def apply(self, update: ChainUpdate) -> None:
        if isinstance(update, Added):
            b = update.block
            self.added += 1
            want = self.chain[-1][0] + 1 if self.chain else 0
            if b.num != want:
                self._problem(f"block {b.num} added where {want} was next")
                return
            if self.chain and b.parent != self.chain[-1][1]:
                self._problem(f"block {b.num} does not extend the tip")
                return
            self.chain.append((b.num, b.hash))
        elif isinstance(update, Removed):
            self.removed += 1
            if not self.chain or self.chain[-1] != (update.num, update.hash):
                self._problem(f"removal of {update.num} that is not the tip")
                return
            self.chain.pop()

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def compare(self, expected: list[Known]) -> list[str]:
        """Differences from the expected canonical chain (empty: the same chain)."""
        diffs = list(self.problems)
        if self.problem_count > len(self.problems):
            diffs.append(f"... {self.problem_count - len(self.problems)} more")
        if len(self.chain) != len(expected):
            diffs.append(f"{len(self.chain)} blocks received, {len(expected)} canonical")
        for (num, got), want in zip(self.chain, expected, strict=False):
            if got != want.hash:
                diffs.append(
                    f"block {num}: 0x{got.hex()[:12]} received, 0x{want.hash.hex()[:12]} canonical"
                )
                break
        return diffs
