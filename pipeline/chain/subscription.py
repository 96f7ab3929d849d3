"""One websocket subscriber's side of the server: params, the bounded outbox, the sink.

The :class:`Outbox` is the only send buffer of a connection: a bounded deque
of ready JSON texts, UTF-8 encoded once, drained by one writer task. Catch-up
waits for room (``put``); live fan-out never waits (``offer``): a full outbox
means the subscriber fell behind and it is disconnected with that reason.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.chain import jsonrpc
from pipeline.chain.batch import hex_quantity, parse_hash, parse_quantity
from pipeline.chain.cardinal import CARDINAL, READY, SEED, encoding_for, reorg_text
from pipeline.chain.patterns import KeyFilter, compile_patterns
from pipeline.chain.planning import Emit
from pipeline.errors import BadBatch, BadParams, SlowConsumer

METHOD = "cardinal_subscribe"
_EXTRAS = {"ready", "reorgs", "weight"}

#: Live notification texts by (prefix, result), encoded: a live block's results
#: are shared string objects, and subscription ids such as "0x1" repeat across
#: connections, so subscribers with the same pattern set and id share one
#: encoded text (one encoding per block, not one per subscriber). Bounded:
#: cleared when full, and texts longer than LIVE_CACHE_MAX_CHARS are never
#: kept (at most about 8 MB).
_LIVE_TEXTS: dict[tuple[str, str], bytes] = {}
LIVE_CACHE_LIMIT = 1024
LIVE_CACHE_MAX_CHARS = 8192


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscribeParams:
    num: int
    hash: bytes
    keep: KeyFilter | None
    ready: bool = False
    reorgs: bool = False
    #: the seed dialect's opt-in: ``batch`` results carry ``"weight"``
    weight: bool = False


def parse_subscribe(params: Any) -> SubscribeParams:
    """``["streams", "0xNUM", "0xHASH", [patterns], {extras}?]``; raises :class:`BadParams`."""
    if not isinstance(params, list) or not 3 <= len(params) <= 5:
        raise BadParams(
            'params must be ["streams", "0xNUM", "0xHASH", [patterns]] (+ an optional options object)'
        )
    if params[0] != "streams":
        raise BadParams(f'unknown subscription kind {str(params[0])[:40]!r}: only "streams"')
    try:
        num = parse_quantity(params[1])
    except BadBatch as exc:
        raise BadParams(f"block number: {exc}") from exc
    try:
        block_hash = parse_hash(params[2])
    except BadBatch as exc:
        raise BadParams(f"block hash: {exc}") from exc
    keep = compile_patterns(params[3] if len(params) > 3 else None)
    extras: Any = params[4] if len(params) > 4 else {}
    if not isinstance(extras, dict):
        raise BadParams("the options parameter must be an object")
    unknown = set(extras) - _EXTRAS
    if unknown:
        raise BadParams(f"unknown options {sorted(unknown)}; known: {sorted(_EXTRAS)}")
    if not all(isinstance(v, bool) for v in extras.values()):
        raise BadParams("options take true or false")
    return SubscribeParams(
        num=num,
        hash=block_hash,
        keep=keep,
        ready=extras.get("ready", False),
        reorgs=extras.get("reorgs", False),
        weight=extras.get("weight", False),
    )


class Outbox:
    """Bounded queue of encoded texts to send on one connection (one writer task drains it).

    ``direct``, when set, is handed what :meth:`offer` takes while nothing is
    queued; it sends what it can at once and returns how many it sent (the
    rest are queued in order): the live fan-out's path without a wake-up of
    the writer task per subscriber. It must send nothing while the writer
    holds texts it popped.
    """

    def __init__(self, limit: int, direct: Callable[[list[bytes]], int] | None = None) -> None:
        if limit < 1:
            raise ValueError("outbox limit must be positive")
        self.limit = limit
        self.direct = direct
        self._items: deque[bytes] = deque()
        self._data = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, texts: list[bytes]) -> bool:
        """Send (``direct``) or queue now if there is room for all of them, else False."""
        if len(self._items) + len(texts) > self.limit:
            return False
        if not self._items and self.direct is not None:
            sent = self.direct(texts)
            if sent >= len(texts):
                return True
            texts = texts[sent:]
        self._items.extend(texts)
        self._data.set()
        return True

    def wake(self) -> None:
        """Wake the writer with nothing queued (``direct`` left it a send to finish)."""
        self._data.set()

    async def put(self, texts: list[bytes]) -> None:
        """Queue, waiting for room; a list longer than the limit goes in once the queue is empty."""
        while self._items and len(self._items) + len(texts) > self.limit:
            self._room.clear()
            await self._room.wait()
        self._items.extend(texts)
        self._data.set()

    async def wait(self) -> None:
        await self._data.wait()

    def pop_many(self, limit: int) -> list[bytes]:
        """Up to ``limit`` queued texts, oldest first (empty when none)."""
        items = self._items
        if len(items) <= limit:
            out = list(items)
            items.clear()
        else:
            out = [items.popleft() for _ in range(limit)]
        if not items:
            self._data.clear()
        if len(items) <= self.limit // 2:
            self._room.set()
        return out

    def pop(self) -> bytes | None:
        if not self._items:
            self._data.clear()
            self._room.set()
            return None
        text = self._items.popleft()
        if len(self._items) <= self.limit // 2:
            self._room.set()
        return text


def _live_text(prefix: str, result: str, suffix: str) -> bytes:
    if len(result) > LIVE_CACHE_MAX_CHARS:
        return (prefix + result + suffix).encode()
    key = (prefix, result)
    text = _LIVE_TEXTS.get(key)
    if text is None:
        text = (prefix + result + suffix).encode()
        if len(_LIVE_TEXTS) >= LIVE_CACHE_LIMIT:
            _LIVE_TEXTS.clear()
        _LIVE_TEXTS[key] = text
    return text


class Subscription:
    """The :class:`~pipeline.chain.planning.BlockSink` of one websocket subscription.

    ``dialect`` is ``"seed"`` or ``"cardinal"`` (:mod:`pipeline.chain.cardinal`).
    In the cardinal dialect ``ready`` is always sent, and a reorg is sent the
    way the library's own producer sends one: the blocks of the heavier branch,
    each with its weight, from the common ancestor up. The library's
    ``OrderedMessageProcessor`` finds the reorg itself, in order, and reports
    the replaced blocks in ``ChainUpdate.Removed()``. A ``reorg`` result is sent
    only where the library's producer would call ``Reorg``: for a reorg deeper
    than ``deep_reorg`` blocks (the library's consumer forgets blocks beyond
    twice its threshold, so weights alone cannot take it there), and with
    ``announce`` before the first block (the server did not start where the
    subscriber said it was: its ``lastHash`` must move to the block below the
    first one sent). The library applies a ``reorg`` result at once, on its
    reader, ahead of blocks still queued behind it: sent for every reorg during
    a catch-up burst, it made the library drop whole runs of heights.
    """

    def __init__(
        self,
        sub_id: str,
        params: SubscribeParams,
        outbox: Outbox,
        *,
        envelope: bool = True,
        dialect: str = SEED,
        announce: bool = False,
        deep_reorg: int = 64,
    ) -> None:
        self.id = sub_id
        self.params = params
        #: what resumption takes as ``keep``: the key filter in this dialect's encoding
        self.keep = encoding_for(params.keep, dialect, params.weight)
        self.cardinal = dialect == CARDINAL
        self._announce = announce and self.cardinal
        self._deep_reorg = deep_reorg
        self._outbox = outbox
        # Without the envelope each text is the bare result object (the Dialogue feed).
        self._prefix = jsonrpc.notification_prefix(METHOD, sub_id) if envelope else ""
        self._suffix = jsonrpc.NOTIFICATION_SUFFIX if envelope else ""
        self.blocks = 0
        self.is_live = False

    def _texts(self, emits: list[Emit], *, shared: bool = False) -> list[bytes]:
        """Encoded notification texts; ``shared``: reuse the live cache's (live blocks only)."""
        prefix = self._prefix
        suffix = self._suffix
        self.blocks += len(emits)
        if not (shared or self.cardinal or (self.params.reorgs and any(e.reorg for e in emits))):
            # catch-up in the seed dialect, nothing to announce: one pass (a lake page
            # costs 0.15 us less a block; catchup_blocks_per_s of make bench B=resume)
            return [(prefix + r + suffix).encode() for emit in emits for r in emit.results]
        out: list[bytes] = []
        for emit in emits:
            if self.cardinal:
                if emit.reorg > self._deep_reorg or self._announce:
                    self._announce = False
                    ancestor = reorg_text(max(emit.num - 1, 0), emit.parent)
                    out.append((prefix + ancestor + suffix).encode())
            elif emit.reorg and self.params.reorgs:
                out.append(
                    (
                        prefix + f'{{"type":"reorg","num":"{hex_quantity(emit.num)}",'
                        f'"depth":"{hex_quantity(emit.reorg)}"}}' + suffix
                    ).encode()
                )
            if shared:
                out.extend([_live_text(prefix, r, suffix) for r in emit.results])
            else:
                out.extend([(prefix + r + suffix).encode() for r in emit.results])
        return out

    async def put(self, emits: list[Emit]) -> None:
        await self._outbox.put(self._texts(emits))

    def put_nowait(self, emits: list[Emit]) -> None:
        texts = self._texts(emits, shared=True)
        if not self._outbox.offer(texts):
            raise SlowConsumer(
                f"send buffer of {self._outbox.limit} messages is full",
                public=f"subscriber too slow: send buffer of {self._outbox.limit} messages full",
            )

    def ready(self, num: int, hash: str) -> None:
        self.is_live = True
        if self.cardinal:
            if not self._outbox.offer([(self._prefix + READY + self._suffix).encode()]):
                raise SlowConsumer("send buffer full at the live head")
            return
        if not self.params.ready:
            return
        num_text = f'"{hex_quantity(num)}"' if num >= 0 else "null"
        hash_text = f'"0x{hash}"' if hash else "null"
        body = f'{{"type":"ready","num":{num_text},"hash":{hash_text}}}'
        if not self._outbox.offer([(self._prefix + body + self._suffix).encode()]):
            raise SlowConsumer("send buffer full at the live head")
