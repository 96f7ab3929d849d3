"""The model: the heaviest chain of every block written, as Sluice's fork choice defines it.

Blocks are added in production order (the order of the Redis stream). The
heaviest block wins (greatest effective weight: ``weight``, or ``num + 1``
without one), ties to the block seen first; the chain is its ancestors by
parent links. A block whose parent is known at another height than
``num - 1`` is refused, as serve and the lake jobs refuse it, and so is every
block descending from a refused one (it links to nothing served).

On a Sentinel group the blocks come only once the replica holds them, so a
failover never takes one away (:mod:`tests.history.redisgroup`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.blockcodec import Block, effective_weight


@dataclass(frozen=True, slots=True)
class Known:
    num: int
    parent: str
    weight: int
    order: int


class ChainModel:
    def __init__(self) -> None:
        self.blocks: dict[str, Known] = {}
        self.refused: set[str] = set()
        self._head: str | None = None

    def add(self, block: Block) -> None:
        h, parent = block.hash.hex(), block.parent.hex()
        if h in self.blocks:
            return  # written again: the first stands
        up = self.blocks.get(parent)
        if parent in self.refused or (up is not None and up.num != block.num - 1):
            self.refused.add(h)
            return
        known = Known(
            block.num, parent, effective_weight(block.num, block.weight), len(self.blocks)
        )
        self.blocks[h] = known
        head = self.blocks.get(self._head) if self._head is not None else None
        if head is None or known.weight > head.weight:
            self._head = h

    @property
    def head(self) -> tuple[int, str] | None:
        if self._head is None:
            return None
        return self.blocks[self._head].num, self._head

    def chain(self) -> dict[int, str]:
        """Height -> hash of the heaviest chain, down as far as parent links reach."""
        out: dict[int, str] = {}
        h = self._head
        while h is not None and h in self.blocks:
            known = self.blocks[h]
            out[known.num] = h
            h = known.parent
        return out

    def hash_at(self, num: int) -> str | None:
        return self.chain().get(num)
