"""The seed's JSON form of a block, read back: results parsed, checked, and assembled into a block."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.blockcodec.block import HASH_LEN, MAX_WEIGHT_BITS, Block, SubBatch, short_repr
from pipeline.errors import BadBatch

_MAX_QUANTITY_DIGITS = 16


def parse_quantity(text: object) -> int:
    """Inverse of :func:`hex_quantity`; raises :class:`BadBatch` on anything else."""
    if not isinstance(text, str) or not text.startswith("0x"):
        raise BadBatch(f"expected a 0x hex quantity, got {short_repr(text)}")
    digits = text[2:]
    if not digits or len(digits) > _MAX_QUANTITY_DIGITS or not _is_hex(digits):
        raise BadBatch(f"expected a 0x hex quantity of 1 to 16 digits, got {short_repr(text)}")
    return int(digits, 16)


def parse_data(text: object) -> bytes:
    """``0x`` hex bytes; an odd digit count (the seed's ``0x01234``) gets a leading zero."""
    if not isinstance(text, str) or not text.startswith("0x"):
        raise BadBatch(f"expected 0x hex data, got {short_repr(text)}")
    digits = text[2:]
    if len(digits) % 2:
        digits = "0" + digits
    if not _is_hex(digits):
        raise BadBatch(f"expected 0x hex data, got {short_repr(text)}")
    return bytes.fromhex(digits)


def parse_hash(text: object) -> bytes:
    """A ``0x`` hash of exactly 32 bytes."""
    value = parse_data(text)
    if len(value) != HASH_LEN:
        raise BadBatch(f"a hash is {HASH_LEN} bytes, got {len(value)}")
    return value


def _is_hex(digits: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in digits)


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
        raise BadBatch(f"expected a 0x hex weight, got {short_repr(text)}")
    digits = text[2:]
    if not digits or not _is_hex(digits) or (len(digits) > 1 and digits[0] == "0"):
        raise BadBatch(f"expected a 0x hex weight without leading zeros, got {short_repr(text)}")
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
