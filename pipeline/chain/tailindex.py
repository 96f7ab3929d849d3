"""The Redis tail's metadata, pure: the heaviest chain and every hash seen (:class:`TailIndex`).

:func:`index_entry` adds one stream entry to an index, refusing what the
live path would refuse (:func:`indexable`, :func:`decode_servable`). No I/O
here: :mod:`pipeline.chain.history.tail` keeps the index of a server up to date.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.blockcodec import (
    ENTRY_FIELD,
    MAX_BLOCK_NUM,
    Block,
    check_raw,
    decode_block,
    decode_raw,
    effective_weight,
    raw_weight,
)
from pipeline.errors import BadBatch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TailIndex:
    """The Redis tail, metadata only: the heaviest chain and every hash seen.

    ``chain`` maps heights to (hash, parent, entry id) of the chain ending at
    the heaviest block (fork choice: the greatest effective weight, ties to
    the block seen first); ``seen`` maps every hash to (num, parent, entry id,
    effective weight). A block heavier than the head on another branch moves
    the chain to that branch (walking its parents through ``seen``), also
    when the branch is shorter; a lighter one only joins ``seen``.
    """

    chain: dict[int, tuple[str, str, bytes]] = field(default_factory=dict)
    seen: dict[str, tuple[int, str, bytes, int]] = field(default_factory=dict)
    last_id: bytes = b"0-0"
    hi: int = -1
    head_weight: int = -1

    @property
    def lo(self) -> int | None:
        return min(self.chain) if self.chain else None

    def add(
        self, num: int, hash: str, parent: str, entry_id: bytes, weight: int | None = None
    ) -> None:
        self.last_id = entry_id
        if hash in self.seen:
            return  # published again: the first entry stands
        w = effective_weight(num, weight)
        self.seen[hash] = (num, parent, entry_id, w)
        if self.chain and w <= self.head_weight:
            return  # not heavier than the head: a side block
        branch = [(num, hash, parent, entry_id)]
        chain, seen = self.chain, self.seen
        while chain:
            at = chain.get(branch[-1][0] - 1)
            if at is not None and at[0] == branch[-1][2]:
                break  # linked to the chain
            up = seen.get(branch[-1][2])
            if up is None or up[0] != branch[-1][0] - 1 or len(branch) > len(seen):
                break  # parent unknown here: replace from this height, as production order did
            branch.append((up[0], branch[-1][2], up[1], up[2]))
        start = branch[-1][0]
        for height in range(start, self.hi + 1):
            chain.pop(height, None)
        for n, h, p, e in reversed(branch):
            chain[n] = (h, p, e)
        self.hi = num
        self.head_weight = w


def index_entry(
    tail: TailIndex,
    entry_id: bytes,
    fields: dict[bytes, bytes],
    refused: Callable[[bytes, Exception], None] | None = None,
    admit: Callable[[bytes, int, str, str], bool] | None = None,
) -> tuple[int, str] | None:
    """Add one Redis entry's metadata to ``tail``: its (num, hash), or None when invalid.

    The whole entry is checked (size, then shape: :func:`check_raw`), so the
    catch-up encoders never meet a block the live path would refuse. An
    invalid entry only moves ``last_id``, and is handed to ``refused`` (else logged);
    ``admit`` refuses a block whose height lies (:meth:`~pipeline.chain.history.entries.Refusals.admit`).
    """
    try:
        raw = decode_raw(fields[ENTRY_FIELD])
        check_raw(raw)
        num, hash = raw["num"], raw["hash"].hex()
        if not indexable(num, raw["hash"], raw["parent"]):
            raise BadBatch("block number or hashes out of range")
        parent = raw["parent"].hex()
        if admit is not None and not admit(entry_id, num, hash, parent):
            tail.last_id = entry_id
            return None  # set aside (counted and logged by ``admit``)
        below = tail.chain.get(num - 1)
        if below is not None and below[0] == parent:
            parent = below[0]  # one string for the parent and its hash: about 110 bytes an entry
        tail.add(num, hash, parent, entry_id, raw_weight(raw))
    except (BadBatch, KeyError, AttributeError, TypeError) as exc:
        if refused is not None:
            refused(entry_id, exc)
        else:
            log.warning("skipping invalid chain entry %r: %s", entry_id, exc)
        tail.last_id = entry_id
        return None
    return num, hash


def indexable(num: object, hash: object, parent: object) -> bool:
    """Whether an entry's metadata can join the index: a number the lake can hold, 32-byte hashes.

    A number past :data:`MAX_BLOCK_NUM` would otherwise become the head of the
    tail for good (its implied weight beats every real block).
    """
    return (
        type(num) is int
        and 0 <= num <= MAX_BLOCK_NUM
        and isinstance(hash, bytes)
        and isinstance(parent, bytes)
        and len(hash) == len(parent) == 32
    )


def decode_servable(data: bytes) -> Block:
    """:func:`decode_block`, refusing (``BadBatch``) a number past :data:`MAX_BLOCK_NUM`.

    Such a block cannot be archived, and its implied weight would beat every
    real block after it: one such entry would stop live data for everyone.
    """
    block = decode_block(data)
    if block.num > MAX_BLOCK_NUM:
        raise BadBatch(f"block number {block.num} is past {MAX_BLOCK_NUM}")
    return block


__all__ = ["TailIndex", "decode_servable", "index_entry", "indexable"]
