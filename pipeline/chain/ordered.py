"""The ordered processor (the seed's OrderedMessage role): pure, no I/O.

Theory of operation: a subscriber may receive blocks twice, out of order, and
as reorg branches. :class:`BlockAssembler` joins each ``batch`` result with its
``subbatch`` results into a whole :class:`Block`. :class:`OrderedChain` keeps
the hashes of the last ``window`` heights of the subscriber's chain and turns
each whole block into updates:

- a block already in the chain is dropped (duplicate);
- a block extending the head (``num == head + 1`` and ``parent`` = head hash)
  is :class:`Added`, then any held block that now extends the head follows;
- a block at or below the head with another hash, whose parent is in the
  chain (or, right after :meth:`OrderedChain.expect_rewind`, below what the
  chain remembers), is a reorg: the replaced heights
  are :class:`Removed` from the head down, then the block is :class:`Added`;
- anything else (a gap, or a branch block whose parent has not arrived yet)
  is held, at most ``max_pending`` blocks; more raises :class:`OrderingError`
  and the caller resumes from :attr:`OrderedChain.head`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pipeline.chain.batch import BatchHeader, Block, SubBatch, assemble
from pipeline.errors import ChainError


class OrderingError(ChainError):
    """Too many blocks held out of order: resume from the last complete block."""

    public_message = "too many out-of-order blocks"


@dataclass(frozen=True, slots=True, kw_only=True)
class Added:
    """``block`` is now the chain's block at ``block.num``."""

    block: Block


@dataclass(frozen=True, slots=True, kw_only=True)
class Removed:
    """The block ``hash`` at ``num`` left the chain (a reorg)."""

    num: int
    hash: bytes


ChainUpdate = Added | Removed


class OrderedChain:
    def __init__(
        self,
        *,
        head: tuple[int, bytes] | None = None,
        window: int = 4096,
        max_pending: int = 4096,
    ) -> None:
        if window < 1 or max_pending < 1:
            raise ValueError("window and max_pending must be positive")
        self._window = window
        self._max_pending = max_pending
        self._hashes: dict[int, bytes] = {}
        self._head: int | None = None
        self._pending: dict[bytes, Block] = {}
        self._rewind_ok = False
        if head is not None:
            self._head = head[0]
            self._hashes[head[0]] = head[1]

    @property
    def head(self) -> tuple[int, bytes] | None:
        """(num, hash) of the last block of the chain, or None before the first."""
        if self._head is None:
            return None
        return self._head, self._hashes[self._head]

    def hash_at(self, num: int) -> bytes | None:
        return self._hashes.get(num)

    def expect_rewind(self) -> None:
        """Call on each (re)subscription: the server's first block may lie below the memory.

        Otherwise a block older than what the chain remembers is taken for a
        stale duplicate and dropped.
        """
        self._rewind_ok = True

    @property
    def pending(self) -> int:
        return len(self._pending)

    def accept(self, block: Block) -> list[ChainUpdate]:
        out: list[ChainUpdate] = []
        if self._place(block, out):
            self._drain(out)
        else:
            if block.hash not in self._pending:
                if len(self._pending) >= self._max_pending:
                    raise OrderingError(
                        f"{len(self._pending)} blocks held out of order after head {self._head}"
                    )
                self._pending[block.hash] = block
        return out

    def _place(self, block: Block, out: list[ChainUpdate]) -> bool:
        """Apply ``block`` if it fits now; False when it must wait."""
        head = self._head
        hashes = self._hashes
        if head is None:
            self._add(block, out)
            return True
        if hashes.get(block.num) == block.hash:
            self._rewind_ok = False
            return True  # duplicate
        if block.num == head + 1:
            self._rewind_ok = False
            if hashes[head] == block.parent:
                self._add(block, out)
                return True
            return False
        if block.num > head + 1:
            return False
        rewind, self._rewind_ok = self._rewind_ok, False
        if block.num < self._low() and not rewind:
            return True  # older than anything remembered: a stale duplicate
        parent_num = block.num - 1
        known_parent = hashes.get(parent_num)
        if known_parent == block.parent or (known_parent is None and parent_num < self._low()):
            for num in range(head, block.num - 1, -1):
                old = hashes.pop(num, None)
                if old is not None:
                    out.append(Removed(num=num, hash=old))
            self._head = parent_num if parent_num in hashes else None
            self._add(block, out)
            return True
        return False

    def _low(self) -> int:
        return min(self._hashes) if self._hashes else 0

    def _add(self, block: Block, out: list[ChainUpdate]) -> None:
        self._hashes[block.num] = block.hash
        self._head = block.num
        out.append(Added(block=block))
        stale = block.num - self._window
        if stale in self._hashes:
            del self._hashes[stale]
        if len(self._hashes) > self._window:
            for num in [n for n in self._hashes if n <= stale]:
                del self._hashes[num]

    def _drain(self, out: list[ChainUpdate]) -> None:
        progress = True
        while progress and self._pending:
            progress = False
            for key, block in list(self._pending.items()):
                if self._place(block, out):
                    del self._pending[key]
                    progress = True
            head = self._head
            if head is not None:
                for key in [k for k, b in self._pending.items() if b.num < head - self._window]:
                    del self._pending[key]


class BlockAssembler:
    """Joins ``batch`` and ``subbatch`` results into whole blocks (bounded)."""

    def __init__(self, *, max_partial: int = 1024) -> None:
        self._max = max_partial
        self._partial: OrderedDict[bytes, tuple[BatchHeader, dict[bytes, SubBatch]]] = OrderedDict()
        self._early: OrderedDict[tuple[bytes, bytes], SubBatch] = OrderedDict()

    def batch(self, header: BatchHeader) -> Block | None:
        subs: dict[bytes, SubBatch] = {}
        for sub_id in header.batches.values():
            early = self._early.pop((header.hash, sub_id), None)
            if early is not None:
                subs[sub_id] = early
        if len(subs) == len(set(header.batches.values())):
            self._partial.pop(header.hash, None)
            return assemble(header, subs.values())
        self._partial[header.hash] = (header, subs)
        self._partial.move_to_end(header.hash)
        while len(self._partial) > self._max:
            self._partial.popitem(last=False)
            raise OrderingError(f"more than {self._max} blocks waiting for sub-batches")
        return None

    def subbatch(self, block_hash: bytes, sub: SubBatch) -> Block | None:
        entry = self._partial.get(block_hash)
        if entry is None:
            self._early[(block_hash, sub.id)] = sub
            while len(self._early) > self._max:
                self._early.popitem(last=False)  # a stray duplicate: its block is long done
            return None
        header, subs = entry
        subs[sub.id] = sub
        if all(i in subs for i in header.batches.values()):
            del self._partial[block_hash]
            return assemble(header, subs.values())
        return None
