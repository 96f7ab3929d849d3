"""Producers of chain streams: Redis stream, the live websocket hub, and the mux of both.

A :class:`Producer` takes one whole block at a time. :class:`MuxProducer`
sends each block to every transport in order and, when some fail, raises
:class:`MuxError` listing every failure (not only the first) after trying
all of them.

:class:`WebsocketHub` is the live fan-out inside ``sluice serve``: it
publishes each block once, as a :class:`LiveBlock` whose JSON results are
encoded once per distinct pattern set and shared by every listener. Listeners
are called synchronously (``offer``), so the hub never queues anything itself:
each listener owns a bounded buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import (
    ENTRY_FIELD,
    Block,
    KeyTest,
    block_raw,
    effective_weight,
    encode_block,
)
from pipeline.chain.cardinal import Encoding, encode_results
from pipeline.chain.outbox import FanoutBatch
from pipeline.chain.planning import Emit
from pipeline.errors import ChainError, MuxError
from pipeline.redisio.conn import parse_entry_id

log = logging.getLogger(__name__)


class Producer(Protocol):
    async def send(self, block: Block) -> None: ...

    async def close(self) -> None: ...


class RedisStreamProducer:
    """XADDs one entry per block (field ``block`` = msgpack bytes) to ``keys.stream(name)``."""

    def __init__(self, client: aioredis.Redis, stream: str, *, maxlen: int | None = None) -> None:
        self._client = client
        self._key = keys.stream(stream)
        self._maxlen = maxlen
        self.last_id: bytes | None = None

    async def send(self, block: Block) -> None:
        entry_id = await self._client.xadd(
            self._key, {ENTRY_FIELD: encode_block(block)}, maxlen=self._maxlen, approximate=True
        )
        self.last_id = entry_id if isinstance(entry_id, bytes) else str(entry_id).encode()

    async def close(self) -> None:
        await self._client.aclose()


#: :func:`share_key` of a key filter whose encodings cannot be shared (no ``patterns``).
UNSHARED: Hashable = object()
#: Encodings (distinct dialect and filter shapes) one live block keeps.
ENCODINGS_PER_BLOCK = 64


def share_key(keep: KeyTest | None) -> Hashable:
    """The key under which a live block shares its encoding for ``keep`` with every subscriber.

    ``keep`` is a key filter or a :class:`~pipeline.chain.cardinal.Encoding`;
    :data:`UNSHARED` when it cannot be shared (a filter that does not say its patterns).
    """
    if isinstance(keep, Encoding):
        key = keep.cache_key
        return UNSHARED if key is None else key
    if keep is None:
        return None
    patterns = getattr(keep, "patterns", None)
    return UNSHARED if patterns is None else patterns


@dataclass(slots=True, eq=False)
class LiveBlock:
    """One block as published live, with one shared :class:`Emit` per encoding."""

    num: int
    hash: str
    parent: str
    raw: dict[str, Any]
    entry_id: bytes | None = None
    #: the effective weight (``num + 1`` for a block without one): what fork choice compares
    weight: int = 0
    #: the shared :class:`Emit` of each :func:`share_key` (see :meth:`emit`)
    by_key: dict[Hashable, Emit] = field(default_factory=dict)

    @classmethod
    def from_block(cls, block: Block, entry_id: bytes | None = None) -> LiveBlock:
        return cls(
            num=block.num,
            hash=block.hash.hex(),
            parent=block.parent.hex(),
            raw=block_raw(block),
            entry_id=entry_id,
            weight=effective_weight(block.num, block.weight),
        )

    def emit(self, keep: KeyTest | None, key: Hashable = UNSHARED) -> Emit:
        """The block as an :class:`Emit` for ``keep`` (``key``: its :func:`share_key`).

        Subscribers with the same key get the same object, results encoded once
        and notification frames shared (:func:`~pipeline.chain.serve.frames.frames_for`).
        Callers never change it.
        """
        if key is UNSHARED:
            return Emit(self.num, self.hash, self.parent, self._encode(keep), 0, self.weight)
        hit = self.by_key.get(key)
        if hit is None:
            hit = Emit(self.num, self.hash, self.parent, self._encode(keep), 0, self.weight)
            if len(self.by_key) < ENCODINGS_PER_BLOCK:
                hit.frames = {}
                self.by_key[key] = hit
        return hit

    def results(self, keep: KeyTest | None) -> list[str]:
        """Result texts for ``keep`` (a key filter or a :class:`~pipeline.chain.cardinal.Encoding`)."""
        return self.emit(keep, share_key(keep)).results

    def _encode(self, keep: KeyTest | None) -> list[str]:
        return encode_results(self.raw, self.num, self.hash, self.parent, keep)


class Listener(Protocol):
    def offer(self, item: LiveBlock) -> None:
        """Take one live block now, without awaiting (a listener buffers or drops itself)."""


class WebsocketHub:
    """Live fan-out to every registered listener; also a :class:`Producer`."""

    def __init__(self) -> None:
        self._listeners: dict[int, Listener] = {}
        self.published = 0
        self.last: LiveBlock | None = None
        #: The Redis entry id up to which the feed (a RedisTailer) has read the stream:
        #: every later entry will be published, or refused as resumption refuses it.
        #: None: unknown (no tailer, or it ended).
        self.read_to: bytes | None = None
        #: the writer wake-ups of one publish, sent inline by :meth:`flush` (pipeline.chain.outbox)
        self.batch = FanoutBatch()
        #: Offered every block before the listeners, and not counted among them: the live
        #: groups (:class:`pipeline.chain.history.live.LiveGroups`), which deliver to listeners
        #: in the same fork-choice state at once.
        self.groups: Listener | None = None

    def __len__(self) -> int:
        return len(self._listeners)

    def add(self, listener: Listener) -> None:
        self._listeners[id(listener)] = listener

    def discard(self, listener: Listener) -> None:
        self._listeners.pop(id(listener), None)

    def covers(self, entry_id: bytes) -> bool:
        """Every entry after ``entry_id`` will be published from now on (none was yet).

        A listener added now, with no await in between, misses nothing after
        ``entry_id``: resumption then needs no replay of Redis to join the live feed.
        """
        read_to = self.read_to
        return read_to is not None and parse_entry_id(read_to) <= parse_entry_id(entry_id)

    def publish(self, item: LiveBlock) -> None:
        """Offer ``item`` to every listener now; await :meth:`flush` next to send it inline."""
        self.published += 1
        self.last = item
        with self.batch.held():
            if self.groups is not None:
                self.groups.offer(item)
            for listener in list(self._listeners.values()):
                listener.offer(item)

    async def flush(self) -> None:
        """Send what the last publish queued, from the caller's task where no wait is needed."""
        await self.batch.flush()

    async def send(self, block: Block) -> None:
        self.publish(LiveBlock.from_block(block))
        await self.flush()

    async def close(self) -> None:
        self._listeners.clear()


class MuxProducer:
    """Sends each block to every transport, in order; reports every failure.

    When a :class:`RedisStreamProducer` precedes a hub, the hub's live block
    carries the Redis entry id, so subscribers can tell where the stream and
    the live feed meet.
    """

    def __init__(self, transports: Sequence[tuple[str, Producer]]) -> None:
        if not transports:
            raise ValueError("a MuxProducer needs at least one transport")
        self._transports = list(transports)

    async def send(self, block: Block) -> None:
        failures: list[tuple[str, BaseException]] = []
        entry_id: bytes | None = None
        for name, transport in self._transports:
            try:
                if isinstance(transport, WebsocketHub):
                    transport.publish(LiveBlock.from_block(block, entry_id))
                    await transport.flush()
                else:
                    await transport.send(block)
                    if isinstance(transport, RedisStreamProducer):
                        entry_id = transport.last_id
            except (ChainError, OSError, aioredis.RedisError, ValueError) as exc:
                log.warning("transport %s failed for block %d: %r", name, block.num, exc)
                failures.append((name, exc))
        if failures:
            raise MuxError(failures)

    async def close(self) -> None:
        failures: list[tuple[str, BaseException]] = []
        for name, transport in self._transports:
            try:
                await transport.close()
            except (ChainError, OSError, aioredis.RedisError) as exc:
                failures.append((name, exc))
        if failures:
            raise MuxError(failures)
