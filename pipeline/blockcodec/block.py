"""A block and its msgpack form: one whole block per Redis stream entry, decoded within bounds.

A block batch is ``num, weight, hash, parent, updates {key: bytes}, deletes
[key], batches {prefix: subbatch_id}`` plus its sub-batches ``{id, updates,
deletes}``. In Redis one stream entry holds one whole block: the entry has a
single field :data:`ENTRY_FIELD` whose value is :func:`encode_block`'s bytes.

Weight is the block's total difficulty in Cardinal's sense: an integer of at
most 256 bits (:data:`MAX_WEIGHT_BITS`), stored in the msgpack map under
``weight`` as big-endian minimal bytes (``b""`` for zero), absent for blocks
written before weights existed. Such a block counts as ``num + 1``
(:func:`effective_weight`, used everywhere a weight is compared). The
heaviest chain is canonical; ties go to the block seen first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from pipeline.errors import BadBatch

#: The one field of a chain-stream entry.
ENTRY_FIELD = b"block"
HASH_LEN = 32
#: The largest block number: the lake stores ``num`` as int64.
MAX_BLOCK_NUM = 2**63 - 1
#: A weight is a non-negative integer of at most this many bits.
MAX_WEIGHT_BITS = 256
WEIGHT_BYTES = MAX_WEIGHT_BITS // 8
#: The largest stream entry decoded: a longer one is refused on its length, before any work.
MAX_ENTRY_BYTES = 4 << 20
#: Keys of one map, items of one list: a msgpack header announcing more is refused
#: by the unpacker before it builds anything (a block with a million keys costs nothing).
MAX_ITEMS = 100_000
#: Deeper msgpack is refused by the unpacker itself (its fixed stack), without recursion.
MAX_DEPTH = 1024


def effective_weight(num: int, weight: int | None) -> int:
    """The weight compared by fork choice: ``weight``, or ``num + 1`` for blocks without one."""
    return num + 1 if weight is None else weight


def check_weight(weight: object) -> int:
    """``weight`` when it is an int in ``[0, 2**256)``; else :class:`BadBatch`."""
    if not isinstance(weight, int) or isinstance(weight, bool):
        raise BadBatch(f"block weight must be an integer, got {short_repr(weight)}")
    if weight < 0:
        raise BadBatch("block weight must be non-negative")
    if weight.bit_length() > MAX_WEIGHT_BITS:
        raise BadBatch(f"block weight must fit in {MAX_WEIGHT_BITS} bits")
    return weight


def weight_to_bytes(weight: int) -> bytes:
    """Big-endian minimal bytes (``b""`` for zero): the msgpack form."""
    return weight.to_bytes((weight.bit_length() + 7) // 8, "big")


def weight_from_bytes(data: object) -> int:
    """Inverse of :func:`weight_to_bytes` (leading zero bytes allowed, at most 32 bytes)."""
    if not isinstance(data, bytes):
        raise BadBatch("block weight must be msgpack bin (big-endian bytes)")
    if len(data) > WEIGHT_BYTES:
        raise BadBatch(f"block weight must fit in {MAX_WEIGHT_BITS} bits")
    return int.from_bytes(data, "big")


def weight_bytes32(weight: int | None) -> bytes | None:
    """The lake's ``blocks.weight`` form: 32 bytes big-endian (byte order is numeric order)."""
    return None if weight is None else weight.to_bytes(WEIGHT_BYTES, "big")


def raw_weight(raw: dict[str, Any]) -> int | None:
    """The stored weight of a :func:`decode_raw` map (None when absent); :class:`BadBatch` if bad."""
    data = raw.get("weight")
    return None if data is None else weight_from_bytes(data)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubBatch:
    """One sub-batch of a block: the updates and deletes under one key prefix."""

    id: bytes
    updates: dict[str, bytes] = field(default_factory=dict)
    deletes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """One whole block; ``weight`` None means "written before weights" (counts ``num + 1``)."""

    num: int
    hash: bytes
    parent: bytes
    updates: dict[str, bytes] = field(default_factory=dict)
    deletes: tuple[str, ...] = ()
    batches: dict[str, bytes] = field(default_factory=dict)
    subbatches: tuple[SubBatch, ...] = ()
    #: total difficulty; None for blocks written before weights existed (see effective_weight)
    weight: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.num, int) or isinstance(self.num, bool) or self.num < 0:
            raise BadBatch(f"block num must be a non-negative int, got {self.num!r}")
        if self.num > MAX_BLOCK_NUM:
            raise BadBatch(f"block num {self.num} is past {MAX_BLOCK_NUM} (the lake stores int64)")
        if self.weight is not None:
            check_weight(self.weight)
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
    """The msgpack form stored in one Redis stream entry (no ``weight`` key when None)."""
    body = {"num": block.num, "hash": block.hash, "parent": block.parent, **block_raw(block)}
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


def _unpack(data: object) -> dict[str, Any]:
    """The msgpack map in ``data``, within :data:`MAX_ENTRY_BYTES` and :data:`MAX_ITEMS`.

    The length is checked before anything is decoded, and the unpacker refuses
    an over-long map, list, string or bytes from its header: an entry costs at
    most the work of decoding :data:`MAX_ENTRY_BYTES`.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadBatch(f"entry must be bytes, got {type(data).__name__}")
    if len(data) > MAX_ENTRY_BYTES:
        raise BadBatch(f"entry of {len(data)} bytes: at most {MAX_ENTRY_BYTES}")
    try:
        raw = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_map_len=MAX_ITEMS,
            max_array_len=MAX_ITEMS,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise BadBatch(f"not msgpack: {exc}") from exc
    if not isinstance(raw, dict):
        raise BadBatch("block must be a map")
    return raw


def decode_block(data: bytes) -> Block:
    """Inverse of :func:`encode_block`; raises :class:`BadBatch` on anything invalid."""
    raw = _unpack(data)
    try:
        subs = raw.get("subbatches", [])
        if not isinstance(subs, list):
            raise BadBatch("subbatches must be a list")
        batches = _batches(raw.get("batches", {}))
        return Block(
            num=raw["num"],
            weight=raw_weight(raw),
            hash=raw["hash"],
            parent=raw["parent"],
            updates=_updates(raw.get("updates", {})),
            deletes=_deletes(raw.get("deletes", [])),
            batches=batches,
            subbatches=tuple(_subbatch(s) for s in subs),
        )
    except KeyError as exc:
        raise BadBatch(f"block is missing {exc.args[0]!r}") from exc


def _batches(raw: Any) -> dict[str, bytes]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, bytes) for k, v in raw.items()
    ):
        raise BadBatch("batches must map str prefixes to bytes ids")
    return raw


def _subbatch(raw: Any) -> SubBatch:
    if not isinstance(raw, dict):
        raise BadBatch("subbatch must be a map")
    sub_id = raw.get("id")
    if not isinstance(sub_id, bytes):
        raise BadBatch("subbatch id must be bytes")
    return SubBatch(
        id=sub_id,
        updates=_updates(raw.get("updates", {})),
        deletes=_deletes(raw.get("deletes", [])),
    )


def decode_raw(data: bytes) -> dict[str, Any]:
    """The msgpack map of :func:`encode_block`, unchecked beyond being a map within the
    bounds of :func:`_unpack` (fast path; :func:`check_raw` checks the rest)."""
    return _unpack(data)


def check_raw(raw: dict[str, Any]) -> None:
    """:class:`BadBatch` unless ``raw`` has the shape :func:`decode_block` accepts.

    What the catch-up encoders rely on when they read a :func:`decode_raw` map.
    """
    Block(
        num=raw.get("num"),  # type: ignore[arg-type]  # checked by Block
        hash=raw.get("hash"),  # type: ignore[arg-type]
        parent=raw.get("parent"),  # type: ignore[arg-type]
        weight=raw_weight(raw),
    )
    _updates(raw.get("updates", {}))
    _deletes(raw.get("deletes", []))
    _batches(raw.get("batches", {}))
    subs = raw.get("subbatches", [])
    if not isinstance(subs, list):
        raise BadBatch("subbatches must be a list")
    for sub in subs:
        _subbatch(sub)


def block_raw(block: Block) -> dict[str, Any]:
    """The map :func:`decode_raw` would return for this block."""
    raw: dict[str, Any] = {
        "updates": block.updates,
        "deletes": list(block.deletes),
        "batches": block.batches,
        "subbatches": [
            {"id": s.id, "updates": s.updates, "deletes": list(s.deletes)} for s in block.subbatches
        ],
    }
    if block.weight is not None:
        raw["weight"] = weight_to_bytes(block.weight)
    return raw


def short_repr(value: object) -> str:
    """``value`` for an error message: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
