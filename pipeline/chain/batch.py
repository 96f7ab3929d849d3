"""Block batches: the pure codec (msgpack for Redis, the seed's JSON for websockets).

A block batch is ``num, hash, parent, updates {key: bytes}, deletes [key],
batches {prefix: subbatch_id}`` plus its sub-batches ``{id, updates,
deletes}``. In Redis one stream entry holds one whole block: the entry has a
single field :data:`ENTRY_FIELD` whose value is :func:`encode_block`'s bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from pipeline.errors import BadBatch

#: The one field of a chain-stream entry.
ENTRY_FIELD = b"block"
HASH_LEN = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class SubBatch:
    id: bytes
    updates: dict[str, bytes] = field(default_factory=dict)
    deletes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    num: int
    hash: bytes
    parent: bytes
    updates: dict[str, bytes] = field(default_factory=dict)
    deletes: tuple[str, ...] = ()
    batches: dict[str, bytes] = field(default_factory=dict)
    subbatches: tuple[SubBatch, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.num, int) or isinstance(self.num, bool) or self.num < 0:
            raise BadBatch(f"block num must be a non-negative int, got {self.num!r}")
        for name in ("hash", "parent"):
            value = getattr(self, name)
            if not isinstance(value, bytes) or len(value) != HASH_LEN:
                raise BadBatch(f"block {name} must be {HASH_LEN} bytes")


def _updates(raw: Any) -> dict[str, bytes]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, bytes) for k, v in raw.items()
    ):
        raise BadBatch("updates must map str keys to bytes")
    return raw


def _deletes(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list | tuple) or not all(isinstance(k, str) for k in raw):
        raise BadBatch("deletes must be a list of str")
    return tuple(raw)


def encode_block(block: Block) -> bytes:
    """The msgpack form stored in one Redis stream entry."""
    out: bytes = msgpack.packb(
        {
            "num": block.num,
            "hash": block.hash,
            "parent": block.parent,
            "updates": block.updates,
            "deletes": list(block.deletes),
            "batches": block.batches,
            "subbatches": [
                {"id": s.id, "updates": s.updates, "deletes": list(s.deletes)}
                for s in block.subbatches
            ],
        },
        use_bin_type=True,
    )
    return out


def decode_block(data: bytes) -> Block:
    """Inverse of :func:`encode_block`; raises :class:`BadBatch` on anything invalid."""
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise BadBatch(f"not msgpack: {exc}") from exc
    if not isinstance(raw, dict):
        raise BadBatch("block must be a map")
    try:
        subs = raw.get("subbatches", [])
        if not isinstance(subs, list):
            raise BadBatch("subbatches must be a list")
        batches = raw.get("batches", {})
        if not isinstance(batches, dict) or not all(
            isinstance(k, str) and isinstance(v, bytes) for k, v in batches.items()
        ):
            raise BadBatch("batches must map str prefixes to bytes ids")
        return Block(
            num=raw["num"],
            hash=raw["hash"],
            parent=raw["parent"],
            updates=_updates(raw.get("updates", {})),
            deletes=_deletes(raw.get("deletes", [])),
            batches=batches,
            subbatches=tuple(
                SubBatch(
                    id=s["id"],
                    updates=_updates(s.get("updates", {})),
                    deletes=_deletes(s.get("deletes", [])),
                )
                for s in subs
                if isinstance(s, dict) or _raise("subbatch must be a map")
            ),
        )
    except KeyError as exc:
        raise BadBatch(f"block is missing {exc.args[0]!r}") from exc


def _raise(message: str) -> bool:
    raise BadBatch(message)
