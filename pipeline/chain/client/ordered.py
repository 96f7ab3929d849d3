"""The ordered processor (the seed's OrderedMessage role): pure, no I/O.

Theory of operation: a subscriber may receive blocks twice, out of order, and
as reorg branches. :class:`BlockAssembler` joins each ``batch`` result with its
``subbatch`` results into a whole :class:`Block`. :class:`OrderedChain` keeps
the hashes of the last ``window`` heights of the subscriber's chain, the
heaviest chain it has seen (fork choice: the greatest
:func:`~pipeline.blockcodec.effective_weight`, ties to the block seen first),
and turns each whole block into updates:

- a block already in the chain, or already held, is dropped (duplicate);
- a block whose parent is the head and that is heavier than the head is
  :class:`Added`, then any held block that now fits follows;
- a block whose parent is known (in the chain, or a held side block) on
  another branch, and heavier than the head, is a reorg: the heights above
  the common ancestor are :class:`Removed` from the head down, then the
  branch (held side blocks first) is :class:`Added`; this follows a reorg to
  a shorter but heavier chain too;
- a block whose parent is known but that is not heavier than the head is
  held as a side block (it may become part of a heavier branch later), and
  so are the blocks a reorg removes (the last :data:`RETAIN` heights);
- right after :meth:`OrderedChain.expect_rewind` the server's first block
  that is not a duplicate is taken as it comes when its parent is in the
  chain or below what the chain remembers (the server chose where to resume);
- a branch block whose parent has not arrived yet is held too;
- with ``gaps=True`` (a feed that sends in order: the subscriber library), a
  block above ``head + 1`` whose parent is neither in the chain nor held
  (the producer skipped blocks, as the cardinal library's producer does
  while a subscriber catches up) raises :class:`ChainGap` at once, and the
  caller resumes from :attr:`OrderedChain.head`; without it such a block is
  held until its parent comes. At most ``max_pending`` blocks are held; more
  raises :class:`OrderingError`, handled the same way.

Held blocks are indexed by parent hash: a block that joins the chain (or is
held) wakes only its own held children, so holding ``n`` blocks costs time
linear in ``n``, not a rescan of every held block on each new one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pipeline.blockcodec import BatchHeader, Block, SubBatch, assemble, effective_weight
from pipeline.errors import ChainGap, OrderingError


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


#: Heights below the head whose blocks are kept so a reorg can hold them again.
RETAIN = 128


def _weight(block: Block) -> int:
    return effective_weight(block.num, block.weight)


#: the parent hash block 0 names: a producer names it as the ancestor of a restart from 0
GENESIS_PARENT = bytes(32)


class OrderedChain:
    def __init__(
        self,
        *,
        head: tuple[int, bytes] | tuple[int, bytes, int] | None = None,
        window: int = 4096,
        max_pending: int = 4096,
        gaps: bool = False,
    ) -> None:
        """``head``: (num, hash) or (num, hash, weight) of the block the subscriber has.

        ``gaps``: raise :class:`ChainGap` on a block past the head that links to
        nothing (see the module doc) instead of holding it.
        """
        if window < 1 or max_pending < 1:
            raise ValueError("window and max_pending must be positive")
        self._window = window
        self._max_pending = max_pending
        self._hashes: dict[int, bytes] = {}
        #: at most the lowest height in ``_hashes``, so the low is found in O(1)
        #: amortized: ``min`` over the window cost O(window) on every block
        self._floor = 0
        self._head: int | None = None
        self._head_weight = 0
        #: blocks held: parent unknown yet, or side blocks not heavier than the head
        self._pending: dict[bytes, Block] = {}
        #: parent hash -> hashes of the held blocks with that parent
        self._children: dict[bytes, set[bytes]] = {}
        #: the head when held blocks far below it were last dropped
        self._swept = 0
        self._gaps = gaps
        #: blocks added in the last RETAIN heights: a reorg holds those it removes again,
        #: so a later, heavier block on their branch brings them back
        self._recent: dict[bytes, Block] = {}
        self._rewind_ok = False
        #: ancestors a producer named (``reorg_to``) that were never added: the chain links
        #: to them, but their removal is no news to the application
        self._unannounced: set[tuple[int, bytes]] = set()
        if head is not None:
            self._head = head[0]
            self._put(head[0], head[1])
            self._head_weight = head[2] if len(head) == 3 else effective_weight(head[0], None)

    @property
    def head(self) -> tuple[int, bytes] | None:
        """(num, hash) of the last block of the chain, or None before the first."""
        if self._head is None:
            return None
        return self._head, self._hashes[self._head]

    @property
    def head_weight(self) -> int | None:
        """The head's effective weight, or None before the first block."""
        return None if self._head is None else self._head_weight

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
        """Blocks held: side blocks (replaced or lighter) and blocks waiting for a parent."""
        return len(self._pending)

    @property
    def unlinked(self) -> int:
        """Held blocks whose parent is neither in the chain nor held (a gap before them)."""
        return sum(
            1
            for b in self._pending.values()
            if self._hashes.get(b.num - 1) != b.parent and b.parent not in self._pending
        )

    def reorg_to(self, num: int, hash: bytes) -> list[ChainUpdate]:
        """The producer named a common ancestor (the cardinal dialect's ``reorg``).

        Every height above ``num`` leaves the chain (:class:`Removed`, head
        first) and ``hash`` becomes the head: the next block on it extends the
        chain whatever its weight, as the library's own processor does. A
        height at or above the head changes nothing.
        """
        out: list[ChainUpdate] = []
        head = self._head
        if head is None or num > head or (num == head and self._hashes.get(num) == hash):
            return out
        self._reorg_to(num, [], out, hold=False)
        if hash == GENESIS_PARENT:  # the ancestor of block 0: start over, nothing is kept
            self._reorg_to(-1, [], out, hold=False)
            self._head = None
            self._rewind_ok = False
            return out
        old = self._hashes.get(num)
        if old is not None and old != hash:
            self._removed(num, old, out)
        if old != hash:  # named, never added: linked to, but never reported removed
            self._unannounced.add((num, hash))
        self._put(num, hash)
        self._head = num
        self._head_weight = -1
        self._rewind_ok = False
        self._drain(out, [hash])
        return out

    def accept(self, block: Block) -> list[ChainUpdate]:
        out: list[ChainUpdate] = []
        if self._place(block, out):
            self._drain(out, [])
        elif block.hash not in self._pending:
            head = self._head
            if (
                self._gaps
                and head is not None
                and block.num > head + 1
                and block.parent not in self._pending
                and not self._in_chain(block.num - 1, block.parent)
            ):
                raise ChainGap(
                    f"block {block.num} does not link to anything held (head {head}): "
                    "blocks were skipped"
                )
            if len(self._pending) >= self._max_pending:
                raise OrderingError(
                    f"{len(self._pending)} blocks held out of order after head {self._head}"
                )
            self._hold(block)
            self._drain(out, [block.hash])  # held children may now form a heavier branch
        return out

    def _hold(self, block: Block) -> None:
        self._pending[block.hash] = block
        self._children.setdefault(block.parent, set()).add(block.hash)

    def _unhold(self, hash: bytes) -> None:
        block = self._pending.pop(hash, None)
        if block is None:
            return
        kids = self._children.get(block.parent)
        if kids is not None:
            kids.discard(hash)
            if not kids:
                del self._children[block.parent]

    def _in_chain(self, num: int, hash: bytes) -> bool:
        return self._hashes.get(num) == hash

    def _place(self, block: Block, out: list[ChainUpdate]) -> bool:
        """Apply (or drop) ``block`` if it can be decided now; False when it must be held."""
        head = self._head
        hashes = self._hashes
        if head is None:
            self._add(block, out)
            return True
        if hashes.get(block.num) == block.hash:
            self._rewind_ok = False
            return True  # duplicate
        rewind, self._rewind_ok = self._rewind_ok, False
        parent_num = block.num - 1
        parent_in_chain = self._in_chain(parent_num, block.parent)
        if rewind and block.num <= head:
            known_parent = hashes.get(parent_num)
            if parent_in_chain or (known_parent is None and parent_num < self._low()):
                self._reorg_to(parent_num, [block], out)
                return True
        if block.num < self._low() and not rewind:
            return True  # older than anything remembered: a stale duplicate
        if parent_in_chain and parent_num == head:
            if _weight(block) > self._head_weight:
                self._add(block, out)
                return True
            return False  # not heavier than the head: a side block, held
        branch = self._branch(block)
        if branch is None:
            return False  # parent not arrived yet
        if _weight(block) <= self._head_weight:
            return False  # a lighter (or equally heavy, later) branch: held
        ancestor = branch[0].num - 1
        for b in branch[:-1]:
            self._unhold(b.hash)
        self._reorg_to(ancestor, branch, out)
        return True

    def _branch(self, block: Block) -> list[Block] | None:
        """``block`` and its held ancestors down to a chain block, oldest first; None if unlinked."""
        branch = [block]
        current = block
        while not self._in_chain(current.num - 1, current.parent):
            held = self._pending.get(current.parent)
            if held is None or held.num != current.num - 1 or len(branch) > self._window:
                return None
            branch.append(held)
            current = held
        branch.reverse()
        return branch

    def _reorg_to(
        self, ancestor: int, branch: list[Block], out: list[ChainUpdate], *, hold: bool = True
    ) -> None:
        """Remove the heights above ``ancestor`` (head first), then add ``branch``.

        ``hold``: the removed blocks are held as side blocks (a heavier block
        on their branch may bring them back); a producer's named ancestor
        drops them instead.
        """
        hashes = self._hashes
        head = self._head
        if head is not None:
            for num in range(head, ancestor, -1):
                old = hashes.pop(num, None)
                if old is not None:
                    self._removed(num, old, out)
                    removed = self._recent.pop(old, None)
                    if hold and removed is not None and len(self._pending) < self._max_pending:
                        self._hold(removed)
        self._head = ancestor if ancestor in hashes else None
        for block in branch:
            self._add(block, out)

    def _removed(self, num: int, hash: bytes, out: list[ChainUpdate]) -> None:
        """Report ``hash`` at ``num`` removed, unless it was only ever a named ancestor."""
        if (num, hash) in self._unannounced:
            self._unannounced.discard((num, hash))
        else:
            out.append(Removed(num=num, hash=hash))

    def _put(self, num: int, hash: bytes) -> None:
        """Set the chain's block at ``num``, keeping ``_floor`` at most the lowest height."""
        if not self._hashes or num < self._floor:
            self._floor = num
        self._hashes[num] = hash

    def _low(self) -> int:
        """The lowest height remembered (0 when none): ``_floor`` moved up to it."""
        hashes = self._hashes
        if not hashes:
            return 0
        floor = self._floor
        while floor not in hashes:  # heights dropped below the window since the last call
            floor += 1
        self._floor = floor
        return floor

    def _add(self, block: Block, out: list[ChainUpdate]) -> None:
        self._put(block.num, block.hash)
        self._head = block.num
        self._head_weight = _weight(block)
        out.append(Added(block=block))
        self._recent[block.hash] = block
        if len(self._recent) > 2 * RETAIN:
            low = block.num - RETAIN
            for key in [k for k, b in self._recent.items() if b.num < low]:
                del self._recent[key]
            while len(self._recent) > 2 * RETAIN:
                del self._recent[next(iter(self._recent))]
        stale = block.num - self._window
        if stale in self._hashes:
            del self._hashes[stale]
        if len(self._hashes) > self._window:
            for num in [n for n in self._hashes if n <= stale]:
                del self._hashes[num]

    def _drain(self, out: list[ChainUpdate], roots: list[bytes]) -> None:
        """Place the held blocks that ``out``'s additions (and ``roots``) may have unblocked.

        Only the held children of a block that joined the chain or was held
        are tried: each try either places the block (its own additions wake
        its children in turn) or leaves it held.
        """
        scanned = 0
        while True:
            while scanned < len(out):
                update = out[scanned]
                scanned += 1
                if isinstance(update, Added):
                    roots.append(update.block.hash)
            if not roots:
                break
            kids = self._children.get(roots.pop())
            if not kids:
                continue
            for key in list(kids):
                block = self._pending.get(key)
                if block is not None and self._place(block, out):
                    self._unhold(key)
        self._sweep()

    def _sweep(self) -> None:
        """Drop held blocks far below the head (at most once per quarter window of progress)."""
        head = self._head
        if head is None or head - self._swept < max(self._window // 4, 1) or not self._pending:
            return
        self._swept = head
        for key in [k for k, b in self._pending.items() if b.num < head - self._window]:
            self._unhold(key)


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
