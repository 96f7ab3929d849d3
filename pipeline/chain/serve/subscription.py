"""One websocket subscriber's side of the server: params and the sink.

A :class:`Subscription` turns blocks into notification texts and queues them
on its connection's bounded :class:`~pipeline.chain.outbox.Outbox`. Catch-up
waits for room (``put``); live fan-out never waits (``put_nowait``, with the
frames every subscriber shares: :mod:`pipeline.chain.serve.frames`): a full outbox
means the subscriber fell behind and it is disconnected with that reason.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.blockcodec import hex_quantity, parse_hash, parse_quantity
from pipeline.chain import jsonrpc
from pipeline.chain.burst import SharedFrames
from pipeline.chain.cardinal import CARDINAL, READY, SEED, encoding_for, reorg_text
from pipeline.chain.outbox import Outbox
from pipeline.chain.planning import Emit
from pipeline.chain.serve.frames import frames_for
from pipeline.chain.serve.patterns import KeyFilter, compile_patterns
from pipeline.errors import BadBatch, BadParams, ReorgReconnect, SlowConsumer

METHOD = "cardinal_subscribe"
_EXTRAS = {"ready", "reorgs", "weight"}


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


class Subscription:
    """The :class:`~pipeline.chain.planning.BlockSink` of one websocket subscription.

    ``dialect`` is ``"seed"`` or ``"cardinal"`` (:mod:`pipeline.chain.cardinal`).
    In the cardinal dialect ``ready`` is always sent, and a reorg is sent the
    way the library's own producer sends one: the blocks of the heavier branch,
    each with its weight, from the common ancestor up. The library's
    ``OrderedMessageProcessor`` finds the reorg itself, in order, and reports
    the replaced blocks in ``ChainUpdate.Removed()``. A ``reorg`` result is sent
    only where the library's producer would call ``Reorg``: for a reorg deeper
    than ``deep_reorg`` blocks, or whose replaced blocks and new branch together
    nearly fill twice that (the library's consumer forgets blocks beyond twice its
    threshold, old and new branch counted together, so weights alone cannot take
    it there); on a connection that already sent blocks it closes the connection
    instead (:class:`~pipeline.errors.ReorgReconnect`), and with
    ``announce`` before the first block (the server did not start where the
    subscriber said it was: its ``lastHash`` must move to the block below the
    first one sent). The library applies a ``reorg`` result at once, on its
    reader, ahead of blocks still queued behind it: sent for every reorg during
    a catch-up burst, it made the library drop whole runs of heights.

    A reorg forking below the lowest block the library holds as *finished*
    (``_floor``: the subscriber's own block, or after an announce the first block
    sent, since ``HandleReorg`` moves ``lastHash`` to the ancestor without
    finishing it) cannot be linked by the library either: it queued such a
    branch for ever with no error (history checker seed 1062). It is treated as
    a deep one: named before the first block, else the connection is closed.
    """

    __slots__ = (
        "_announce",
        "_deep_reorg",
        "_floor",
        "_outbox",
        "_prefix",
        "_suffix",
        "blocks",
        "cardinal",
        "id",
        "is_live",
        "keep",
        "params",
    )

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
        #: the lowest block number the library holds as finished (see the class doc)
        self._floor = params.num
        self._deep_reorg = deep_reorg
        self._outbox = outbox
        # Without the envelope each text is the bare result object (the Dialogue feed).
        # Interned: live frames are shared by prefix (pipeline.chain.serve.frames), found by identity.
        self._prefix = sys.intern(jsonrpc.notification_prefix(METHOD, sub_id)) if envelope else ""
        self._suffix = jsonrpc.NOTIFICATION_SUFFIX if envelope else ""
        self.blocks = 0
        self.is_live = False

    def _texts(self, emits: list[Emit], *, shared: bool = False) -> list[bytes]:
        """Encoded notification texts; ``shared``: the live frames shared by subscribers."""
        prefix = self._prefix
        suffix = self._suffix
        self.blocks += len(emits)
        if not (shared or self.cardinal or (self.params.reorgs and any(e.reorg for e in emits))):
            # catch-up in the seed dialect, nothing to announce: one pass (a lake page
            # costs 0.15 us less a block; catchup_blocks_per_s of make bench B=resume)
            return [(prefix + r + suffix).encode() for emit in emits for r in emit.results]
        out: list[bytes] = []
        for i, emit in enumerate(emits):
            if self.cardinal:
                # the library's processor keeps 2 x threshold finished blocks, old branch,
                # ancestor and new branch together (one spare): past that it cannot find
                # the ancestor itself ("Reached genesis"), so it is named
                if (
                    emit.reorg
                    and (
                        emit.reorg > self._deep_reorg
                        or emit.reorg + len(emits) - i + 2 > 2 * self._deep_reorg
                        or emit.num - 1 < self._floor
                    )
                    or self._announce
                ):
                    if not self._announce and self.blocks > len(emits):
                        # blocks went out before: the library may still hold some unread
                        raise ReorgReconnect(f"reorg of {emit.reorg} at block {emit.num}")
                    self._announce = False
                    self._floor = emit.num
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
                out.extend(frames_for(emit, prefix, suffix))
            else:
                out.extend([(prefix + r + suffix).encode() for r in emit.results])
        return out

    async def put(self, emits: list[Emit]) -> None:
        await self._outbox.put(self._texts(emits))

    def put_nowait(self, emits: list[Emit]) -> None:
        if len(emits) == 1 and not emits[0].reorg and not self._announce:
            # one live block, nothing to announce (either dialect): its shared frames as they
            # are (frames_for's cache hit spelt out: once per subscriber and block)
            # (the frames' wire form too: written at once by an idle connection, see Outbox)
            emit = emits[0]
            self.blocks += 1
            cache = emit.frames
            hit = cache.get(self._prefix) if cache is not None else None
            texts: Sequence[bytes] = (
                hit if hit is not None else frames_for(emit, self._prefix, self._suffix)
            )
            wire = texts.wire if type(texts) is SharedFrames else None
        else:
            texts, wire = self._texts(emits, shared=True), None
        if not self._outbox.offer(texts, wire):
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
