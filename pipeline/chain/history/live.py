"""A subscriber's live feed: blocks from the hub, buffered until the replay caught up.

The hub (:class:`~pipeline.chain.produce.producer.WebsocketHub`) calls
:meth:`LiveListener.offer` for every block produced; the listener buffers
them (bounded) while resumption replays Redis, then feeds the subscriber's
:class:`~pipeline.chain.forkchoice.Sender` and sink directly. A sink that
cannot keep up fails the listener's ``failed`` future with
:class:`~pipeline.errors.SlowConsumer`; a block whose branch the Sender cannot
link (:class:`~pipeline.errors.BranchUnlinked`, a reorg deeper than it holds)
fails it with that, and resumption plans again from the subscriber's head.

Live groups. Fork choice is per subscriber (each has its own
:class:`~pipeline.chain.forkchoice.Sender`), but live subscribers are nearly
always in the same state: the same head, its hash and weight. Taking each
block through each one's Sender touched hundreds of cache-cold dicts per
block (a third of the live fan-out's samples, ``make bench B=resume``).
:class:`LiveGroups` keeps the live listeners with the same encoding
(:func:`~pipeline.chain.produce.producer.share_key`) and the same
:meth:`~pipeline.chain.forkchoice.Sender.live_state` in one :class:`LiveGroup`,
and decides for all of them at once whether a block takes the Sender's fast
path (a heavier child of the head, whose hash none of them holds). If it
does, every member gets it, and the block joins the group's *run*: the
members' Senders are brought up to date later, the run at a time
(:meth:`~pipeline.chain.forkchoice.Sender.advance`, at most :data:`RUN_LIMIT`
blocks behind). Any other block settles the group and each member decides
alone, exactly as without groups, then joins the group of its new state.
So every subscriber gets exactly what its own Sender would send it
(``tests/unit/chain/test_live_groups.py`` checks that on random chains).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable

from pipeline.blockcodec import KeyTest
from pipeline.chain.forkchoice import Run, Sender
from pipeline.chain.planning import BlockSink, Emit
from pipeline.chain.produce.producer import UNSHARED, LiveBlock, share_key
from pipeline.errors import BranchUnlinked, SlowConsumer
from pipeline.redisio.conn import parse_entry_id

log = logging.getLogger(__name__)
#: Replays tried before a subscriber that cannot catch up with the live head is dropped.
LIVE_ATTEMPTS = 5
#: Blocks a live group delivers before its members' Senders are brought up to date.
RUN_LIMIT = 64
#: Hashes a live group keeps (those its members hold, and its run's) before it recounts them.
KNOWN_LIMIT = 4 * Sender.RETAIN + RUN_LIMIT


class LiveListener:
    """Buffers live blocks (bounded) until the replay caught up, then feeds the sink directly."""

    # Slots and a plain flag: offer runs once per subscriber and block, and each
    # subscriber's objects are cold in the CPU's caches by the time the hub reaches them.
    __slots__ = (
        "_buffer",
        "_dead",
        "_done",
        "_group",
        "_groups",
        "_keep",
        "_key",
        "_limit",
        "_live",
        "_overflow",
        "_sender",
        "_sink",
        "failed",
    )

    def __init__(
        self,
        sender: Sender,
        keep: KeyTest | None,
        sink: BlockSink,
        *,
        limit: int = 4096,
        groups: LiveGroups | None = None,
    ) -> None:
        self._sender = sender
        self._keep = keep
        #: computed once: every live block is looked up by it (once per subscriber and block)
        self._key = share_key(keep)
        self._sink = sink
        self._limit = limit
        self._buffer: list[LiveBlock] = []
        self._overflow = False
        self._live = False
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: :meth:`_fail` ran: offers are ignored from then on
        self._dead = False
        #: where it joins a group once live (None: it never does), and the group it is in
        self._groups = groups
        self._group: LiveGroup | None = None
        #: the block its group left it to take alone (the hub offers it that block again)
        self._done: LiveBlock | None = None

    def reset(self) -> None:
        self._buffer.clear()
        self._overflow = False

    def go_live(self, last_id: bytes) -> bool:
        if self._overflow:
            return False
        last = parse_entry_id(last_id)
        buffered, self._buffer = self._buffer, []
        self._live = True
        self._deliver(
            [b for b in buffered if b.entry_id is None or parse_entry_id(b.entry_id) > last]
        )
        if self._groups is not None and not self._dead:
            self._groups.join(self)
        return True

    def close(self) -> None:
        """The subscription ended: leave its group (the hub's :meth:`discard` is the caller's)."""
        self._dead = True
        group = self._group
        if group is not None:
            group.members.pop(self, None)
            self._group = None

    def offer(self, item: LiveBlock) -> None:
        if self._dead or self._group is not None or item is self._done:
            return  # (a group's member: the group delivers)
        if self._live:
            self.alone(item)
            if self._groups is not None and not self._dead:
                self._groups.join(self)
            return
        if len(self._buffer) >= self._limit:
            self._overflow = True
            self._buffer.clear()
        elif not self._overflow:
            self._buffer.append(item)

    def alone(self, item: LiveBlock) -> None:
        """Fork choice for ``item`` through this subscriber's own Sender, and delivery."""
        key = self._key
        emit = item.by_key.get(key) if key is not UNSHARED else None
        try:
            emits = self._sender.take(emit if emit is not None else item.emit(self._keep, key))
        except BranchUnlinked as exc:
            self._fail(exc)
            return
        if emits:
            self._put(emits)

    def _deliver(self, items: list[LiveBlock]) -> None:
        emits = []
        try:
            for item in items:
                emits.extend(self._sender.take(item.emit(self._keep, self._key)))
        except BranchUnlinked as exc:
            if emits:
                self._put(emits)
            self._fail(exc)
            return
        if emits:
            self._put(emits)

    def _put(self, emits: list[Emit]) -> None:
        if log.isEnabledFor(logging.DEBUG):
            self._log_reorgs(emits)
        try:
            self._sink.put_nowait(emits)
        except SlowConsumer as exc:
            self._fail(exc)

    def _log_reorgs(self, emits: list[Emit]) -> None:
        """One DEBUG line per reorg sent live (rare): what a history checker's failing seed
        needs to see of what this subscriber was sent."""
        for i, emit in enumerate(emits):
            if emit.reorg:
                log.debug(
                    "live: reorg of depth %d sent to subscription %s (%s) from block %d "
                    "(%.16s, parent %.16s), %d blocks up to %d",
                    emit.reorg,
                    getattr(self._sink, "id", "?"),
                    "cardinal" if getattr(self._sink, "cardinal", False) else "seed",
                    emit.num,
                    emit.hash,
                    emit.parent,
                    len(emits) - i,
                    emits[-1].num,
                )

    def _fail(self, exc: SlowConsumer | BranchUnlinked) -> None:
        self.close()
        if not self.failed.done():  # (cancelled with its subscription: nothing to report)
            self.failed.set_exception(exc)


class LiveGroup:
    """Live listeners in one fork-choice state, with one encoding (see the module doc)."""

    __slots__ = ("head", "head_hash", "head_weight", "keep", "key", "known", "members", "run")

    def __init__(self, key: Hashable, keep: KeyTest | None, state: tuple[int, str, int]) -> None:
        self.key = key
        self.keep = keep
        self.head, self.head_hash, self.head_weight = state
        #: every hash a member's Sender holds (a superset): such a block is not for the group
        self.known: set[str] = set()
        #: member -> where in ``run`` its Sender stopped
        self.members: dict[LiveListener, int] = {}
        #: the blocks delivered that the members' Senders have not taken yet
        self.run: list[Emit] = []

    def settle(self) -> None:
        """Bring every member's Sender up to date (:meth:`Sender.advance` with its part of the run)."""
        run = self.run
        if not run:
            return
        runs: dict[int, tuple[list[Emit], Run]] = {}  # members that joined together share one
        for member, start in self.members.items():
            if start < len(run):
                part = runs.get(start)
                if part is None:
                    emits = run[start:]
                    part = runs[start] = (emits, Run.of(emits))
                member._sender.advance(*part)
        self.members = dict.fromkeys(self.members, 0)
        self.run = []
        if len(self.known) > KNOWN_LIMIT:
            known: set[str] = set()
            for member in self.members:
                known.update(member._sender.held())
            self.known = known


class LiveGroups:
    """The live groups of one hub, offered each block before its listeners
    (:attr:`~pipeline.chain.produce.producer.WebsocketHub.groups`); see the module doc."""

    def __init__(self) -> None:
        self._groups: list[LiveGroup] = []
        #: (encoding key, head, head hash, head weight) -> a group in that state: a join
        #: looks its group up at once, however many groups there are (subscribers with
        #: many filters, or split by a reorg, each rejoin)
        self._index: dict[tuple[Hashable, int, str, int], LiveGroup] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def join(self, listener: LiveListener) -> None:
        """Put a live listener in the group of its Sender's state (a new one if none is)."""
        key = listener._key
        state = listener._sender.live_state()
        if state is None or key is UNSHARED:
            return
        at = (key, *state)
        group = self._index.get(at)
        if group is None:
            group = self._index[at] = LiveGroup(key, listener._keep, state)
            self._groups.append(group)
        group.known.update(listener._sender.held())
        group.members[listener] = len(group.run)
        listener._group = group

    def offer(self, item: LiveBlock) -> None:
        alone: list[LiveListener] = []
        index = self._index
        groups, self._groups = self._groups, []
        kept = self._groups  # (rebuilt: a reorg may end every group, each one removed at once)
        for group in groups:
            if not group.members:
                self._unindex(group)
                continue
            key = group.key
            emit = item.by_key.get(key)
            if emit is None:
                emit = item.emit(group.keep, key)
            if (
                emit.num == group.head + 1
                and not emit.reorg
                and emit.weight > group.head_weight
                and emit.parent == group.head_hash
                and emit.hash not in group.known
            ):
                # Sender.take's fast path, decided once for every member
                self._unindex(group)
                group.head, group.head_hash, group.head_weight = emit.num, emit.hash, emit.weight
                index[(key, emit.num, emit.hash, emit.weight)] = group
                group.known.add(emit.hash)
                group.run.append(emit)
                emits = [emit]
                for member in list(group.members):
                    try:
                        member._sink.put_nowait(emits)
                    except SlowConsumer as exc:
                        member._fail(exc)  # (leaves the group)
                if len(group.run) >= RUN_LIMIT:
                    group.settle()
                kept.append(group)
                continue
            # anything else: each member decides alone, as its own Sender says
            group.settle()
            self._unindex(group)
            for member in group.members:
                member._group = None
                member._done = item
                member.alone(item)
                if not member._dead:
                    alone.append(member)
        for member in alone:  # after every group took the block: all are in one state again
            self.join(member)

    def _unindex(self, group: LiveGroup) -> None:
        at = (group.key, group.head, group.head_hash, group.head_weight)
        if self._index.get(at) is group:
            del self._index[at]

    def settle(self) -> None:
        """Bring every member's Sender up to date (tests compare them)."""
        for group in self._groups:
            group.settle()


def live_emit(item: LiveBlock, keep: KeyTest | None) -> Emit:
    """A live block as an :class:`Emit` for ``keep``, shared by every subscriber with that filter."""
    return item.emit(keep, share_key(keep))


__all__ = [
    "KNOWN_LIMIT",
    "LIVE_ATTEMPTS",
    "RUN_LIMIT",
    "LiveGroup",
    "LiveGroups",
    "LiveListener",
    "live_emit",
]
