"""Heights that cannot lie: a block must sit one above its parent, pure.

A producer that continues a chain with wrong arithmetic writes block 273 as
the child of block 2892; served, it would send every consumer back 2,600
heights on a chain that links, with weights that keep growing. :class:`Heights`
remembers the height of each recent block (bounded) and refuses a block whose
parent it knows at any height but ``num - 1``, and every block descending from
a refused one. A block whose parent it does not know (trimmed, in the lake
only, or the first one) is let through: its link is checked where it is used.
"""

from __future__ import annotations

from collections import OrderedDict

#: Recent blocks whose heights are remembered, and refused hashes remembered.
REMEMBER = 1 << 16


class Heights:
    """Every reader of one stream in one process shares one (the decision is the same for all)."""

    __slots__ = ("_bad", "_nums", "_remember", "last_refusal", "refused")

    def __init__(self, remember: int = REMEMBER) -> None:
        self._nums: OrderedDict[str, int] = OrderedDict()
        self._bad: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self.refused = 0
        #: what the last refusal said (for /healthz), None before any
        self.last_refusal: str | None = None

    def check(self, num: int, hash: str, parent: str) -> str | None:
        """None when ``(num, hash)`` may be served; else why not (the block is set aside)."""
        if hash in self._bad:
            return self._why(num, hash, "refused before")
        if parent in self._bad:
            return self._refuse(num, hash, f"its parent {parent[:16]} was set aside", root=False)
        up = self._nums.get(parent)
        if up is not None and up != num - 1:
            return self._refuse(num, hash, f"its parent {parent[:16]} is block {up}, not {num - 1}")
        if hash not in self._nums:
            self._nums[hash] = num
            if len(self._nums) > self._remember:
                self._nums.popitem(last=False)
        return None

    def _refuse(self, num: int, hash: str, cause: str, *, root: bool = True) -> str:
        """Set the block aside; :attr:`last_refusal` names the last block that lied itself
        (not its descendants, which only follow it)."""
        self._bad[hash] = None
        if len(self._bad) > self._remember:
            self._bad.popitem(last=False)
        self.refused += 1
        why = self._why(num, hash, cause)
        if root or self.last_refusal is None:
            self.last_refusal = why
        return why

    @staticmethod
    def _why(num: int, hash: str, cause: str) -> str:
        return f"block {num} ({hash[:16]}) set aside: {cause}"


__all__ = ["REMEMBER", "Heights"]
