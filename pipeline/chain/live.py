"""A subscriber's live feed: blocks from the hub, buffered until the replay caught up.

The hub (:class:`~pipeline.chain.producer.WebsocketHub`) calls
:meth:`LiveListener.offer` for every block produced; the listener buffers
them (bounded) while resumption replays Redis, then feeds the subscriber's
:class:`~pipeline.chain.planning.Sender` and sink directly. A sink that
cannot keep up fails the listener's ``failed`` future with
:class:`~pipeline.errors.SlowConsumer`.
"""

from __future__ import annotations

import asyncio

from pipeline.blockcodec import KeyTest
from pipeline.chain.planning import BlockSink, Emit, Sender
from pipeline.chain.producer import UNSHARED, LiveBlock, share_key
from pipeline.errors import SlowConsumer
from pipeline.redisconn import parse_entry_id

#: Replays tried before a subscriber that cannot catch up with the live head is dropped.
LIVE_ATTEMPTS = 5


class LiveListener:
    """Buffers live blocks (bounded) until the replay caught up, then feeds the sink directly."""

    # Slots and a plain flag: offer runs once per subscriber and block, and each
    # subscriber's objects are cold in the CPU's caches by the time the hub reaches them.
    __slots__ = (
        "_buffer",
        "_dead",
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
        self, sender: Sender, keep: KeyTest | None, sink: BlockSink, *, limit: int = 4096
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
        return True

    def offer(self, item: LiveBlock) -> None:
        if self._dead:
            return
        if self._live:  # once per subscriber and block: kept short
            key = self._key
            emit = item.by_key.get(key) if key is not UNSHARED else None
            emits = self._sender.take(emit if emit is not None else item.emit(self._keep, key))
            if emits:
                try:
                    self._sink.put_nowait(emits)
                except SlowConsumer as exc:
                    self._fail(exc)
            return
        if len(self._buffer) >= self._limit:
            self._overflow = True
            self._buffer.clear()
        elif not self._overflow:
            self._buffer.append(item)

    def _deliver(self, items: list[LiveBlock]) -> None:
        emits = []
        for item in items:
            emits.extend(self._sender.take(item.emit(self._keep, self._key)))
        if emits:
            self._put(emits)

    def _put(self, emits: list[Emit]) -> None:
        try:
            self._sink.put_nowait(emits)
        except SlowConsumer as exc:
            self._fail(exc)

    def _fail(self, exc: SlowConsumer) -> None:
        self._dead = True
        if not self.failed.done():  # (cancelled with its subscription: nothing to report)
            self.failed.set_exception(exc)


def live_emit(item: LiveBlock, keep: KeyTest | None) -> Emit:
    """A live block as an :class:`Emit` for ``keep``, shared by every subscriber with that filter."""
    return item.emit(keep, share_key(keep))


__all__ = ["LIVE_ATTEMPTS", "LiveListener", "live_emit"]
