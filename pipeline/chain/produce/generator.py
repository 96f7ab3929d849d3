"""A synthetic chain for demos, tests and benchmarks: blocks with sub-batches and reorgs.

Deterministic for a given ``seed``. :meth:`SyntheticChain.step` returns the
blocks to emit next, in production order: usually one new block; on a reorg,
the replacement branch starting below the head (its first block's parent is the
canonical block at the fork point), which then becomes canonical.

Every block carries a ``weight`` (total difficulty): its parent's weight plus
a difficulty of 1, so a plain chain weighs ``num + 1`` like blocks written
before weights existed (hand-made blocks without a weight mix in freely). A
replacement branch is always heavier than the chain it replaces (its last
block's difficulty is raised when needed), so the heaviest chain is the
generator's canonical chain, also for :meth:`SyntheticChain.reorg` branches
shorter than what they replace.

Heights come from block numbers, never from list positions: after
:meth:`SyntheticChain.continue_from` the chain held is a suffix (its first
block may be far above 0), and a reorg forks at the head's height minus its
depth, never below the first block held.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, SubBatch, effective_weight, encode_block

GENESIS_PARENT = bytes(32)


class SyntheticChain:
    """Generates blocks; ``canonical`` is the current canonical chain, oldest first.

    Its heights are consecutive: ``canonical[i].num == canonical[0].num + i``.
    From block 0 unless :meth:`continue_from` loaded a suffix of a chain, so
    ``canonical[n]`` is height ``n`` only for a chain generated from block 0.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        keys: int = 64,
        prefixes: Sequence[str] = ("s/",),
        updates_per_block: int = 4,
        deletes_per_block: int = 1,
        value_size: int = 16,
        reorg_every: int = 0,
        reorg_depth: int = 2,
    ) -> None:
        if reorg_depth < 1:
            raise ValueError("reorg_depth must be >= 1")
        self._rng = random.Random(seed)
        self._salt = seed.to_bytes(8, "big", signed=True)
        self.keys = keys
        self.prefixes = tuple(prefixes)
        self.updates_per_block = updates_per_block
        self.deletes_per_block = deletes_per_block
        self.value_size = value_size
        self.reorg_every = reorg_every
        self.reorg_depth = reorg_depth
        self.canonical: list[Block] = []
        #: every block ever emitted, canonical or not, in emission order
        self.emitted: list[Block] = []
        self.reorgs = 0
        self._since_reorg = 0

    @property
    def head(self) -> Block | None:
        return self.canonical[-1] if self.canonical else None

    @property
    def reorg_room(self) -> int:
        """The deepest reorg possible now: the head's height above the first block held."""
        return self.canonical[-1].num - self.canonical[0].num if self.canonical else 0

    def continue_from(self, recent: Sequence[Block]) -> Block | None:
        """Go on from the heaviest of ``recent`` blocks (a stream's last entries), not from 0.

        The chain below the head is rebuilt from ``recent`` by parent links (see
        :func:`linked_chain`): reorgs reach down to its first block, never
        below. Returns the head, or None when ``recent`` is empty (the chain
        starts at block 0). New hashes never repeat an earlier run's: the
        head's hash joins the salt.
        """
        chain = linked_chain(recent)
        if not chain:
            return None
        self.canonical = chain
        head = chain[-1]
        self._salt = hashlib.blake2b(self._salt + head.hash, digest_size=8).digest()
        return head

    def _kv(self, prefix: str) -> tuple[dict[str, bytes], tuple[str, ...]]:
        rng = self._rng
        updates = {
            f"{prefix}k{rng.randrange(self.keys)}": rng.randbytes(self.value_size)
            for _ in range(self.updates_per_block)
        }
        deletes = tuple(
            sorted(
                {f"{prefix}k{rng.randrange(self.keys)}" for _ in range(self.deletes_per_block)}
                - updates.keys()
            )
        )
        return updates, deletes

    def _make(self, num: int, parent: bytes, parent_weight: int = 0, *, floor: int = 0) -> Block:
        """A new block; its weight is ``parent_weight`` plus its difficulty, and above ``floor``."""
        updates, deletes = self._kv("")
        subs = []
        for prefix in self.prefixes:
            sub_updates, sub_deletes = self._kv(prefix)
            digest = hashlib.blake2b(digest_size=32)
            for key in sorted(sub_updates):
                digest.update(key.encode() + b"=" + sub_updates[key])
            for key in sub_deletes:
                digest.update(b"-" + key.encode())
            subs.append(SubBatch(id=digest.digest(), updates=sub_updates, deletes=sub_deletes))
        block_hash = hashlib.blake2b(
            parent + num.to_bytes(8, "big") + self._salt + self._rng.randbytes(8), digest_size=32
        ).digest()
        weight = max(parent_weight + 1, floor + 1)
        return Block(
            num=num,
            weight=weight,
            hash=block_hash,
            parent=parent,
            updates=updates,
            deletes=deletes,
            batches={p: s.id for p, s in zip(self.prefixes, subs, strict=True)},
            subbatches=tuple(subs),
        )

    def step(self) -> list[Block]:
        """The blocks to emit next (one, or a replacement branch on a reorg)."""
        self._since_reorg += 1
        head = self.head
        if (
            head is not None
            and self.reorg_every
            and self._since_reorg >= self.reorg_every
            and self.reorg_room > 0
        ):
            self._since_reorg = 0
            depth = self._rng.randint(1, min(self.reorg_depth, self.reorg_room))
            return self.reorg(depth)
        num = 0 if head is None else head.num + 1
        block = self._make(
            num,
            GENESIS_PARENT if head is None else head.hash,
            0 if head is None else _weight(head),
        )
        self.canonical.append(block)
        self.emitted.append(block)
        return [block]

    def reorg(self, depth: int, length: int | None = None) -> list[Block]:
        """Replace the top ``depth`` blocks by a heavier branch of ``length`` (default depth + 1).

        The replaced heights are ``head.num - depth + 1 .. head.num``; the
        branch's first block is the child of the block at ``head.num - depth``,
        which must be held (``depth <= reorg_room``, else ValueError).
        ``length`` may be shorter than ``depth`` (at least 1): a shorter but
        heavier chain. Returns the branch, which is now canonical.
        """
        length = depth + 1 if length is None else length
        if depth < 1 or length < 1:
            raise ValueError(f"a reorg needs depth >= 1 and length >= 1, got {depth} and {length}")
        if not self.canonical:
            raise ValueError("cannot reorg an empty chain")
        old_head, low = self.canonical[-1], self.canonical[0].num
        if depth > self.reorg_room:
            raise ValueError(
                f"cannot reorg {depth} below head {old_head.num}: "
                f"its fork parent would be below {low}, the first block held"
            )
        fork_parent = self.canonical[-1 - depth]
        if fork_parent.num != old_head.num - depth:
            raise ValueError(f"canonical heights are not consecutive below {old_head.num}")
        del self.canonical[len(self.canonical) - depth :]
        out = []
        for i, num in enumerate(range(fork_parent.num + 1, fork_parent.num + 1 + length)):
            parent = self.canonical[-1]
            last = i == length - 1
            floor = _weight(old_head) if last else 0
            block = self._make(num, parent.hash, _weight(parent), floor=floor)
            self.canonical.append(block)
            out.append(block)
        self.reorgs += 1
        self.emitted.extend(out)
        return out

    def take(self, n: int) -> list[Block]:
        """Emit at least ``n`` more blocks (a reorg branch is never cut) and return them."""
        out: list[Block] = []
        while len(out) < n:
            out.extend(self.step())
        return out


def _weight(block: Block) -> int:
    return effective_weight(block.num, block.weight)


def linked_chain(recent: Sequence[Block]) -> list[Block]:
    """The heaviest of ``recent`` and its ancestors among them, oldest first (empty if none).

    Ties go to the latest (last in ``recent``). The walk down stops at the
    first ancestor missing from ``recent`` or not one height below its child:
    only the linked part is kept, so heights are consecutive.
    """
    if not recent:
        return []
    head = recent[0]
    for block in recent[1:]:
        if _weight(block) >= _weight(head):
            head = block
    by_hash = {b.hash: b for b in recent}
    chain = [head]
    while (parent := by_hash.get(chain[-1].parent)) is not None and parent.num == chain[-1].num - 1:
        chain.append(parent)
    return chain[::-1]


class _XAdd(Protocol):
    def xadd(self, name: str, fields: Mapping[bytes, bytes], id: str = ...) -> object: ...


def write_blocks(
    client: _XAdd, stream: str, blocks: Iterable[Block], *, ids: Iterable[str] | None = None
) -> int:
    """XADD each block as one chain-stream entry of ``stream`` (ids auto unless given)."""
    key = keys.stream(stream)
    id_iter = iter(ids) if ids is not None else None
    count = 0
    for block in blocks:
        fields = {ENTRY_FIELD: encode_block(block)}
        if id_iter is None:
            client.xadd(key, fields)
        else:
            client.xadd(key, fields, id=next(id_iter))
        count += 1
    return count
