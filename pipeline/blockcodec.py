"""Block batches: the pure codec (msgpack for Redis, the seed's JSON for websockets).

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

It sits at the bottom of the layers, beside the other pure codecs: the chain
part and the lake both decode blocks with it, so the lake never imports the
chain part.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
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
        raise BadBatch(f"block weight must be an integer, got {_short(weight)}")
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


# --- the seed's JSON form (websocket) ------------------------------------------
#
# A block goes on the wire as one ``batch`` result followed by one ``subbatch``
# result per sub-batch, exactly as seed 004 shows them: quantities as ``0x``
# hex without leading zeros, hashes, ids and values as ``0x`` hex bytes. The
# encoders below work on the raw msgpack map (``decode_raw``) so the catch-up
# path never builds a :class:`Block` per row.

_MAX_QUANTITY_DIGITS = 16
_json_dumps = json.JSONEncoder(separators=(",", ":")).encode

#: A key filter: ``keep(key) -> bool`` (see ``pipeline.chain.serve.patterns``).
KeyTest = Callable[[str], bool]


def hex_quantity(value: int) -> str:
    """``0x`` hex without leading zeros (``0x0`` for zero)."""
    return f"0x{value:x}"


def parse_quantity(text: object) -> int:
    """Inverse of :func:`hex_quantity`; raises :class:`BadBatch` on anything else."""
    if not isinstance(text, str) or not text.startswith("0x"):
        raise BadBatch(f"expected a 0x hex quantity, got {_short(text)}")
    digits = text[2:]
    if not digits or len(digits) > _MAX_QUANTITY_DIGITS or not _is_hex(digits):
        raise BadBatch(f"expected a 0x hex quantity of 1 to 16 digits, got {_short(text)}")
    return int(digits, 16)


def hex_data(value: bytes) -> str:
    return "0x" + value.hex()


def parse_data(text: object) -> bytes:
    """``0x`` hex bytes; an odd digit count (the seed's ``0x01234``) gets a leading zero."""
    if not isinstance(text, str) or not text.startswith("0x"):
        raise BadBatch(f"expected 0x hex data, got {_short(text)}")
    digits = text[2:]
    if len(digits) % 2:
        digits = "0" + digits
    if not _is_hex(digits):
        raise BadBatch(f"expected 0x hex data, got {_short(text)}")
    return bytes.fromhex(digits)


def parse_hash(text: object) -> bytes:
    """A ``0x`` hash of exactly 32 bytes."""
    value = parse_data(text)
    if len(value) != HASH_LEN:
        raise BadBatch(f"a hash is {HASH_LEN} bytes, got {len(value)}")
    return value


def _is_hex(digits: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in digits)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


_KEY_CACHE: dict[str, str] = {}
_KEY_CACHE_LIMIT = 65536


def _key_json(key: str) -> str:
    """``key`` as a JSON string literal, cached: chains reuse a bounded key space."""
    text = _KEY_CACHE.get(key)
    if text is None:
        text = _json_dumps(key)
        if len(_KEY_CACHE) >= _KEY_CACHE_LIMIT:
            _KEY_CACHE.clear()
        _KEY_CACHE[key] = text
    return text


def _updates_json(updates: dict[str, bytes], keep: KeyTest | None) -> str:
    if not updates:
        return "{}"
    kj = _key_json
    if keep is None:
        parts = [f'{kj(k)}:"0x{v.hex()}"' for k, v in updates.items()]
    else:
        parts = [f'{kj(k)}:"0x{v.hex()}"' for k, v in updates.items() if keep(k)]
    return "{" + ",".join(parts) + "}"


def _deletes_json(deletes: list[str], keep: KeyTest | None) -> str:
    if not deletes:
        return "[]"
    kj = _key_json
    return "[" + ",".join([kj(k) for k in deletes if keep is None or keep(k)]) + "]"


def raw_results(
    raw: dict[str, Any],
    num: int,
    hash_hex: str,
    parent_hex: str,
    keep: KeyTest | None = None,
    weight: int | None = None,
) -> list[str]:
    """The block's ``batch`` result then its ``subbatch`` results, as JSON object texts.

    ``keep`` filters keys of updates, deletes and sub-batches: a sub-batch is
    sent when its prefix or one of its keys is kept, with only the kept keys;
    ``batches`` lists exactly the sub-batches sent. Every block is sent, even
    when nothing in it is kept, so the subscriber can follow the chain.
    ``weight`` (the subscriber opted in) adds ``"weight":"0x.."`` after ``num``;
    without it the seed's shape is unchanged byte for byte.
    """
    if keep is not None or raw.get("subbatches"):
        return _filtered_or_nested_results(raw, num, hash_hex, parent_hex, keep, weight)
    # No filter, no sub-batches (the common block) spelt out: no helper call, the key
    # cache read inline (catchup_cpu_us_per_block of make bench B=resume). The same
    # text as the general path, byte for byte (tests/unit/chain/test_batch.py).
    cache, kj = _KEY_CACHE, _key_json
    try:
        updates = raw.get("updates")
        deletes = raw.get("deletes")
        u_text = (
            ",".join([f'{cache.get(k) or kj(k)}:"0x{v.hex()}"' for k, v in updates.items()])
            if updates
            else ""
        )
        d_text = ",".join([cache.get(k) or kj(k) for k in deletes]) if deletes else ""
    except (AttributeError, KeyError, TypeError) as exc:
        raise BadBatch(f"malformed block map: {exc!r}") from exc
    weight_text = "" if weight is None else f'"weight":"0x{weight:x}",'
    return [
        f'{{"type":"batch","num":"0x{num:x}",{weight_text}"hash":"0x{hash_hex}",'
        f'"parent":"0x{parent_hex}","updates":{{{u_text}}},"deletes":[{d_text}],"batches":{{}}}}'
    ]


def _filtered_or_nested_results(
    raw: dict[str, Any],
    num: int,
    hash_hex: str,
    parent_hex: str,
    keep: KeyTest | None,
    weight: int | None,
) -> list[str]:
    """:func:`raw_results` of a block with sub-batches or for a key filter."""
    try:
        updates = raw.get("updates") or {}
        deletes = raw.get("deletes") or []
        batches: dict[str, bytes] = raw.get("batches") or {}
        subs: list[dict[str, Any]] = raw.get("subbatches") or []
        sub_texts: list[str] = []
        sent: dict[str, str] = {}
        if subs:
            by_id = {s["id"]: s for s in subs}
            for prefix, sub_id in batches.items():
                sub = by_id.get(sub_id)
                if sub is None:
                    continue
                s_updates = sub.get("updates") or {}
                s_deletes = sub.get("deletes") or []
                s_keep = None if keep is None or keep(prefix) else keep
                u_text = _updates_json(s_updates, s_keep)
                d_text = _deletes_json(s_deletes, s_keep)
                if s_keep is not None and u_text == "{}" and d_text == "[]":
                    continue
                id_hex = "0x" + sub_id.hex()
                sent[prefix] = id_hex
                sub_texts.append(
                    f'{{"type":"subbatch","hash":"0x{hash_hex}","id":"{id_hex}",'
                    f'"updates":{u_text},"deletes":{d_text}}}'
                )
        weight_text = "" if weight is None else f'"weight":"0x{weight:x}",'
        head = (
            f'{{"type":"batch","num":"0x{num:x}",{weight_text}"hash":"0x{hash_hex}",'
            f'"parent":"0x{parent_hex}",'
            f'"updates":{_updates_json(updates, keep)},"deletes":{_deletes_json(deletes, keep)},'
            f'"batches":{_json_dumps(sent) if sent else "{}"}}}'
        )
    except (AttributeError, KeyError, TypeError) as exc:
        raise BadBatch(f"malformed block map: {exc!r}") from exc
    return [head, *sub_texts]


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


def block_results(
    block: Block, keep: KeyTest | None = None, *, with_weight: bool = False
) -> list[str]:
    """:func:`raw_results` for a :class:`Block` (``with_weight``: its effective weight too)."""
    weight = effective_weight(block.num, block.weight) if with_weight else None
    return raw_results(
        block_raw(block), block.num, block.hash.hex(), block.parent.hex(), keep, weight
    )


def _json_updates(raw: object) -> dict[str, bytes]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise BadBatch("updates must map keys to 0x hex values")
    return {k: parse_data(v) for k, v in raw.items()}


def _json_deletes(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(k, str) for k in raw):
        raise BadBatch("deletes must be a list of keys")
    return tuple(raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchHeader:
    """A decoded ``batch`` result: the block without its sub-batches yet."""

    num: int
    hash: bytes
    parent: bytes
    updates: dict[str, bytes]
    deletes: tuple[str, ...]
    batches: dict[str, bytes]
    weight: int | None = None


def parse_weight(text: object) -> int:
    """A ``0x`` hex weight (no leading zeros, at most 256 bits); :class:`BadBatch` otherwise."""
    if not isinstance(text, str) or not text.startswith("0x"):
        raise BadBatch(f"expected a 0x hex weight, got {_short(text)}")
    digits = text[2:]
    if not digits or not _is_hex(digits) or (len(digits) > 1 and digits[0] == "0"):
        raise BadBatch(f"expected a 0x hex weight without leading zeros, got {_short(text)}")
    if len(digits) > MAX_WEIGHT_BITS // 4:
        raise BadBatch(f"block weight must fit in {MAX_WEIGHT_BITS} bits")
    return int(digits, 16)


def parse_batch_result(obj: object) -> BatchHeader:
    """Decode a ``batch`` result object (already parsed from JSON)."""
    if not isinstance(obj, dict) or obj.get("type") != "batch":
        raise BadBatch("not a batch result")
    try:
        batches = obj.get("batches", {})
        if not isinstance(batches, dict):
            raise BadBatch("batches must map prefixes to 0x ids")
        weight = obj.get("weight")
        return BatchHeader(
            num=parse_quantity(obj["num"]),
            weight=None if weight is None else parse_weight(weight),
            hash=parse_hash(obj["hash"]),
            parent=parse_hash(obj["parent"]),
            updates=_json_updates(obj.get("updates", {})),
            deletes=_json_deletes(obj.get("deletes", [])),
            batches={str(p): parse_data(i) for p, i in batches.items()},
        )
    except KeyError as exc:
        raise BadBatch(f"batch result is missing {exc.args[0]!r}") from exc


def parse_subbatch_result(obj: object) -> tuple[bytes, SubBatch]:
    """Decode a ``subbatch`` result: (block hash, sub-batch)."""
    if not isinstance(obj, dict) or obj.get("type") != "subbatch":
        raise BadBatch("not a subbatch result")
    try:
        return parse_hash(obj["hash"]), SubBatch(
            id=parse_data(obj["id"]),
            updates=_json_updates(obj.get("updates", {})),
            deletes=_json_deletes(obj.get("deletes", [])),
        )
    except KeyError as exc:
        raise BadBatch(f"subbatch result is missing {exc.args[0]!r}") from exc


def assemble(header: BatchHeader, subs: Iterable[SubBatch]) -> Block:
    """The whole block once every sub-batch listed in ``header.batches`` is known."""
    by_id = {s.id: s for s in subs}
    missing = [p for p, i in header.batches.items() if i not in by_id]
    if missing:
        raise BadBatch(f"sub-batches missing for prefixes {missing}")
    return Block(
        num=header.num,
        weight=header.weight,
        hash=header.hash,
        parent=header.parent,
        updates=header.updates,
        deletes=header.deletes,
        batches=header.batches,
        subbatches=tuple(by_id[i] for i in header.batches.values()),
    )


def block_from_json(texts: Iterable[str]) -> Block:
    """Inverse of :func:`block_results` (the batch text first)."""
    objs = [json.loads(t) for t in texts]
    if not objs:
        raise BadBatch("no batch result")
    header = parse_batch_result(objs[0])
    subs = []
    for obj in objs[1:]:
        block_hash, sub = parse_subbatch_result(obj)
        if block_hash != header.hash:
            raise BadBatch("subbatch of another block")
        subs.append(sub)
    return assemble(header, subs)
