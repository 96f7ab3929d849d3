"""Fork choice over what one subscriber was sent: :class:`Sender`, pure.

Every block resumption emits goes through one :class:`Sender` per
subscriber: it drops what was sent already, detects reorgs of a canonical
source and follows the heaviest chain of blocks in production order (replay,
live). No I/O here: :mod:`pipeline.chain.history.resumption` and
:mod:`pipeline.chain.history.live` drive it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.chain.planning import Emit
from pipeline.errors import BranchUnlinked


class Sender:
    """Dedup, reorg detection and fork choice over what was sent in the last ``window`` heights.

    :meth:`accept` takes blocks of a canonical source (the lake, the tail's
    chain) in height order: a block at or below the head with another hash
    replaces everything from its height up. :meth:`take` takes blocks in
    production order (replay, live) and follows the heaviest chain: a block
    that is not heavier than the head is held as a side block (the last
    :data:`RETAIN` heights), and a heavier block on another branch is sent
    with the held blocks that link it to the sent chain, the first of them
    marked as a reorg above the common ancestor (a shorter, heavier chain too).

    A heavier block that does not link to the sent chain through what is held
    (its branch forks below what the Sender remembers, or it comes after a gap)
    raises :class:`~pipeline.errors.BranchUnlinked`: the caller plans again from
    :attr:`head`, with the fork point found in Redis or the lake. The same block
    offered again after that (nothing links it anywhere) replaces from its height.
    """

    __slots__ = (
        "_blocks",
        "_hashes",
        "_lost",
        "_retried",
        "_window",
        "floor",
        "head",
        "head_weight",
        "sent",
    )

    #: Heights below the head whose blocks are kept to rebuild a branch (at most
    #: 2 * RETAIN blocks per subscriber: deeper branches fall back to production order).
    RETAIN = 128

    def __init__(self, start: int, window: int = 4096) -> None:
        self.floor = start
        self.head = start - 1
        self.head_weight = -1
        self.sent = 0
        self._hashes: dict[int, str] = {}
        self._window = window
        #: hash -> block, sent or held, in the last RETAIN heights
        self._blocks: dict[str, Emit] = {}
        #: the hashes of blocks on branches the lake says lost (:meth:`lose`), oldest first
        self._lost: dict[str, None] = {}
        #: the last block that raised BranchUnlinked: offered again, it is not raised twice
        self._retried: str | None = None

    def accept(
        self, num: int, hash: str, weight: int | None = None, emit: Emit | None = None
    ) -> int | None:
        """None to skip the block, else the reorg depth (0: it extends the head).

        A block right above the head that names another parent than the head (the
        source's chain is not the one sent: a lake read at a version from before a
        reorg) raises :class:`~pipeline.errors.BranchUnlinked` the first time. So
        does a block that replaces sent ones but names another parent than the block
        sent below it: the source's chain forks deeper than this block (a replay's
        fill from the lake reads only ``threshold`` heights below the head, and a
        reorg of depth 111 was sent from block 116 on the old 115: history checker
        seed 1591); planned again, the fork point is found. Both are :meth:`_check_link`.
        """
        if num > self.head:
            if emit is not None and num == self.head + 1:
                self._check_link(emit)
            self.head = num
            self._note(num, hash, weight, emit)
            return 0
        if self.sent == 0 and num < self.floor:
            return None  # below the resume point, before anything was sent
        if self._hashes.get(num) == hash:
            return None
        if emit is not None:
            self._check_link(emit)
        depth = self.head - num + 1
        for height in range(num, self.head + 1):
            self._hashes.pop(height, None)
        self.head = num
        self._note(num, hash, weight, emit)
        return depth

    def accepted(self, emits: Iterable[Emit]) -> list[Emit]:
        """:meth:`accept` for each of ``emits`` in turn (a canonical source's blocks, in
        height order): those to send, the first replacing sent ones carrying the depth."""
        out = []
        for emit in emits:
            depth = self.accept(emit.num, emit.hash, emit.weight, emit)
            if depth is not None:
                emit.reorg = depth
                out.append(emit)
        return out

    def extend(self, emits: list[Emit]) -> None:
        """Note a run of consecutive blocks above the head, in one step.

        The same as :meth:`accept` for each (each would return 0), at a fraction
        of the cost per block: a lake page in catch-up
        (``catchup_blocks_per_s`` of ``make bench B=resume``). Only the last
        ``2 * RETAIN`` blocks of the run are kept for rebuilding branches.
        """
        first, last = emits[0], emits[-1]
        if first.num <= self.head or last.num - first.num + 1 != len(emits):
            raise ValueError("extend takes consecutive blocks above the head")
        if first.num == self.head + 1:
            self._check_link(first)
        hashes = self._hashes
        for emit in emits:
            hashes[emit.num] = emit.hash
        if first.num > 0 and first.num - 1 not in hashes:
            hashes[first.num - 1] = first.parent  # the parent of the first block is on the chain
        for stale in range(max(first.num - self._window, 0), last.num - self._window + 1):
            hashes.pop(stale, None)
        self.sent += len(emits)
        self.head = last.num
        self.head_weight = last.weight
        # what _keep keeps of a run, in one step: blocks at or above head - RETAIN
        blocks = self._blocks
        for emit in emits[-(self.RETAIN + 1) :]:
            blocks[emit.hash] = emit
        if len(blocks) > 2 * self.RETAIN:
            self._prune()

    def take(self, emit: Emit) -> list[Emit]:
        """Fork choice for one block in production order: the blocks to send now (maybe none)."""
        num, hash = emit.num, emit.hash
        if (
            num == self.head + 1
            and self.sent
            and not emit.reorg
            and emit.weight > self.head_weight
            and self._hashes.get(num - 1) == emit.parent
            and hash not in self._blocks
        ):
            # The common live case, a heavier child of the head: what the general path
            # below decides for it, in a few lookups (once per subscriber and block,
            # fanout_cpu_us_per_message of make bench B=resume). _note and _keep spelt
            # out: the parent is on the chain already, the window drops one height.
            self.head = num
            self.sent += 1
            hashes = self._hashes
            hashes[num] = hash
            self.head_weight = emit.weight
            hashes.pop(num - self._window, None)
            blocks = self._blocks
            blocks[hash] = emit
            if len(blocks) > 2 * self.RETAIN:
                self._keep(emit)  # (already kept: this only trims)
            return [emit]
        return self._choose(emit)

    def advance(self, emits: list[Emit], run: Run | None = None) -> None:
        """What :meth:`take` does for each of ``emits`` in turn, each known to take its fast
        path: a heavier child of the head, not held, with nothing to announce (a live group
        checked that for all its members at once, :mod:`pipeline.chain.history.live`). The state
        after it equals the state after those takes, at a fraction of their cost: two dict
        updates (``run``: those of ``emits``, built once for every subscriber taking them)
        and a trim where a take would have trimmed."""
        if not emits:
            return
        if run is None:
            run = Run.of(emits)
        hashes, window = self._hashes, self._window
        hashes.update(run.hashes)
        # take pops num - window after noting num: the same keys (none of the run's own
        # can come back after it: num - window is below every later num)
        for stale in range(emits[0].num - window, emits[-1].num - window + 1):
            hashes.pop(stale, None)
        blocks, limit = self._blocks, 2 * self.RETAIN
        i, count = 0, len(emits)
        while i < count:
            room = limit - len(blocks)  # (never negative: every path trims above it)
            if room <= 0:  # the take that would trim: as it would, from its height
                emit = emits[i]
                blocks[emit.hash] = emit
                self.head = emit.num
                self._keep(emit)
                i += 1
            elif i == 0 and room >= count:
                blocks.update(run.blocks)
                i = count
            else:
                blocks.update({e.hash: e for e in emits[i : i + room]})
                i += room
        last = emits[-1]
        self.head = last.num
        self.head_weight = last.weight
        self.sent += count

    def live_state(self) -> tuple[int, str, int] | None:
        """``(head, head hash, head weight)``: what decides whether a block takes
        :meth:`take`'s fast path, besides the hashes held (:meth:`held`); None before
        anything was sent (every block then takes the general path)."""
        at = self._hashes.get(self.head)
        return None if not self.sent or at is None else (self.head, at, self.head_weight)

    def held(self) -> Iterable[str]:
        """The hashes of the blocks kept (sent or held): a block with one of them never
        takes :meth:`take`'s fast path."""
        return self._blocks.keys()

    def _choose(self, emit: Emit) -> list[Emit]:
        """:meth:`take`'s general path: every case, the fast one included."""
        num, hash = emit.num, emit.hash
        if emit.parent in self._lost:
            self.lose(hash)  # a child of a lost block lost too, however heavy
            return []
        if self.sent == 0 or self._hashes.get(num) == hash:
            return [emit] if self.accept(num, hash, emit.weight, emit) == 0 else []
        if hash in self._blocks:
            return []  # held already (or sent, then reorged away: only a heavier block brings it back)
        linked = self._hashes.get(num - 1) == emit.parent or emit.parent in self._blocks
        if linked and emit.weight <= self.head_weight:
            self._keep(emit)  # not heavier than the head (a tie goes to the first seen): held
            return []
        if not linked:
            if num <= self.head + 1 and emit.weight <= self.head_weight:
                # Not heavier, on a branch forking below what is remembered: held, so the
                # branch's later blocks link to it and its heavier tip finds it (a deeper
                # fork than that raises BranchUnlinked there).
                self._keep(emit)
                return []
            # A gap above the head, or a heavier block whose parent was never seen here.
            return self._unlinked(emit)
        branch = [emit]
        while self._hashes.get(branch[-1].num - 1) != branch[-1].parent:
            held = self._blocks.get(branch[-1].parent)
            if held is None or held.num != branch[-1].num - 1:
                return self._unlinked(emit)  # the held blocks do not reach the sent chain
            branch.append(held)
        branch.reverse()
        ancestor = branch[0].num - 1
        depth = max(0, self.head - ancestor)
        for height in range(ancestor + 1, self.head + 1):
            self._hashes.pop(height, None)
        self.head = ancestor
        out = []
        for i, block in enumerate(branch):
            self.head = block.num
            self._note(block.num, block.hash, block.weight, block)
            out.append(_with_reorg(block, depth if i == 0 else 0))
        return out

    def _check_link(self, emit: Emit) -> None:
        """Raise once if ``emit`` names another parent than the block sent below it (the head,
        for a block right above it; a sent block, for one that replaces sent ones)."""
        at = self._hashes.get(emit.num - 1) if self.sent else None
        if at is not None and at != emit.parent and self.first_unlinked(emit.hash):
            raise BranchUnlinked(emit.num, emit.hash)

    def first_unlinked(self, hash: str) -> bool:
        """Whether ``hash`` is met unlinked for the first time (then noted: a second time
        it is taken as it comes, see :meth:`_unlinked`)."""
        if hash == self._retried:
            return False
        self._retried = hash
        return True

    def _unlinked(self, emit: Emit) -> list[Emit]:
        """A heavier block with no known link to the sent chain: raise once, so the caller
        plans again from the head; offered again (nothing links it anywhere, a foreign
        producer's orphan), it replaces from its height, as a canonical source would."""
        if self.first_unlinked(emit.hash):
            raise BranchUnlinked(emit.num, emit.hash)
        depth = self.accept(emit.num, emit.hash, emit.weight, emit)
        return [] if depth is None else [_with_reorg(emit, depth)]

    def hold(self, emit: Emit) -> None:
        """Keep a block of a side branch without sending it: a heavier child may bring it."""
        if emit.hash not in self._blocks and self._hashes.get(emit.num) != emit.hash:
            self._keep(emit)

    def lose(self, hash: str) -> None:
        """The lake says the block ``hash`` is on a branch that lost: neither it nor any
        block descending from it is sent from now on (each is lost in turn, :meth:`take`).

        Resumption meets such a block when Redis was trimmed past its parent: the
        parent is in the lake only, as not canonical. Its children still come from
        Redis in production order, heavier than the head while that branch led; sent,
        they would follow a branch whose first block the subscriber never got.
        The last ``2 * RETAIN`` are remembered (a lost branch's children come soon after it).
        """
        lost = self._lost
        lost[hash] = None
        if len(lost) > 2 * self.RETAIN:
            del lost[next(iter(lost))]

    def knows(self, num: int, hash: str) -> bool:
        """Whether the block ``hash`` at ``num`` was sent, is held or is lost: a child of
        it links, or is lost with it (no history to read for it either way)."""
        return self._hashes.get(num) == hash or hash in self._blocks or hash in self._lost

    def _keep(self, emit: Emit) -> None:
        self._blocks[emit.hash] = emit
        if len(self._blocks) > 2 * self.RETAIN:
            self._prune()

    def _prune(self) -> None:
        """Drop the blocks below ``head - RETAIN``, then the oldest while over ``2 * RETAIN``."""
        blocks, low = self._blocks, self.head - self.RETAIN
        for h in [h for h, e in blocks.items() if e.num < low]:
            del blocks[h]
        while len(blocks) > 2 * self.RETAIN:  # many side blocks up high: oldest first
            del blocks[next(iter(blocks))]

    def _note(self, num: int, hash: str, weight: int | None, emit: Emit | None) -> None:
        self.sent += 1
        self._hashes[num] = hash
        self.head_weight = num + 1 if weight is None else weight
        if emit is not None:
            self._keep(emit)
            if num > 0 and num - 1 not in self._hashes:
                self._hashes[num - 1] = emit.parent  # the parent of the first block is on the chain
        stale = num - self._window
        if stale in self._hashes:
            del self._hashes[stale]

    def hash_at(self, num: int) -> str | None:
        return self._hashes.get(num)


@dataclass(frozen=True, slots=True)
class Run:
    """The dicts :meth:`Sender.advance` adds for a run of consecutive emits (no hash twice)."""

    hashes: dict[int, str]
    blocks: dict[str, Emit]

    @classmethod
    def of(cls, emits: list[Emit]) -> Run:
        return cls({e.num: e.hash for e in emits}, {e.hash: e for e in emits})


def _with_reorg(emit: Emit, depth: int) -> Emit:
    if emit.reorg == depth:
        return emit
    return Emit(emit.num, emit.hash, emit.parent, emit.results, depth, emit.weight)


__all__ = ["Run", "Sender"]
