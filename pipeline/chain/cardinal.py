"""The ``cardinal`` wire dialect: results exactly as github.com/openrelayxyz/cardinal-streams reads them.

Pure codec, no I/O. The library (v1.5.1, ``transports/websockets.go``) wraps
each subscription result in a ``type`` and a nested object:

- ``{"type":"batch","batch":{"number","weight","hash","parent","values","deletes","batches"}}``
- ``{"type":"subbatch","subbatch":{"hash","batchid","values","deletes"}}``
- ``{"type":"reorg","batch":{"number","hash"}}``: the common ancestor, sent
  before the blocks that replace everything above it;
- ``{"type":"ready"}``: catch-up reached the live head.

Quantities (``number``, ``weight``) are ``0x`` hex without leading zeros
(``hexutil.Uint64``/``hexutil.Big``: a weight has at most 256 bits), values
even-length ``0x`` hex (``hexutil.Bytes``), hashes and batch ids exactly 32
bytes (``types.Hash``). The Go consumer ignores a result it cannot decode
field by field, so the encoder never emits anything else: a sub-batch whose
id is not 32 bytes is folded into the batch's own values and deletes (the Go
consumer merges sub-batches into the block anyway).

:class:`Encoding` says how one subscription's results are written (dialect,
key filter, the seed dialect's weight opt-in); :func:`encode_results` is the
one entry point resumption calls. An :class:`Encoding` is itself a key test
(it delegates to its filter), so it travels through every ``keep`` parameter.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from pipeline.blockcodec import (
    HASH_LEN,
    BatchHeader,
    KeyTest,
    SubBatch,
    effective_weight,
    parse_data,
    parse_hash,
    parse_quantity,
    parse_weight,
    raw_results,
    raw_weight,
)
from pipeline.errors import BadBatch

SEED = "seed"
CARDINAL = "cardinal"
DIALECTS = (SEED, CARDINAL)

#: The JSON-RPC name cardinal-rpc gives ``websocketStreamsService.StreamsBlock``
#: (namespace "cardinal", first letter lower-cased).
STREAMS_BLOCK = "cardinal_streamsBlock"

READY = '{"type":"ready"}'

_dumps = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(frozen=True, slots=True)
class Encoding:
    """How one subscription's results are written.

    ``keep`` filters keys as in the seed dialect; ``cardinal`` selects the
    library's shape (which always carries the weight); ``weight`` adds the
    weight to the seed's ``batch`` result (the subscriber's opt-in).
    """

    keep: KeyTest | None = None
    cardinal: bool = False
    weight: bool = False

    def __call__(self, key: str) -> bool:
        return self.keep is None or self.keep(key)

    @property
    def cache_key(self) -> Hashable | None:
        """A key for caching encoded results, or None when they cannot be cached."""
        patterns = getattr(self.keep, "patterns", None) if self.keep is not None else None
        if self.keep is not None and patterns is None:
            return None
        return (self.cardinal, self.weight, patterns)


def encoding_for(keep: KeyTest | None, dialect: str, weight: bool) -> KeyTest | None:
    """What to pass as ``keep`` to resumption: the plain filter when the seed shape is unchanged."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}")
    if dialect == SEED and not weight:
        return keep
    return Encoding(keep, dialect == CARDINAL, weight)


def encode_results(
    raw: dict[str, Any], num: int, hash_hex: str, parent_hex: str, keep: KeyTest | None = None
) -> list[str]:
    """A block's result texts in the subscription's shape (``keep`` may be an :class:`Encoding`)."""
    if not isinstance(keep, Encoding):
        return raw_results(raw, num, hash_hex, parent_hex, keep)
    weight = effective_weight(num, raw_weight(raw))
    if keep.cardinal:
        return cardinal_results(raw, num, hash_hex, parent_hex, weight, keep.keep)
    return raw_results(raw, num, hash_hex, parent_hex, keep.keep, weight if keep.weight else None)


def _values(updates: dict[str, bytes], keep: KeyTest | None) -> list[str]:
    return [f'{_dumps(k)}:"0x{v.hex()}"' for k, v in updates.items() if keep is None or keep(k)]


def _deletes(deletes: list[str], keep: KeyTest | None) -> list[str]:
    return [_dumps(k) for k in deletes if keep is None or keep(k)]


def cardinal_results(
    raw: dict[str, Any],
    num: int,
    hash_hex: str,
    parent_hex: str,
    weight: int,
    keep: KeyTest | None = None,
) -> list[str]:
    """The ``batch`` result then its ``subbatch`` results, in the library's shape.

    Filtering with ``keep`` is as in :func:`~pipeline.blockcodec.raw_results`:
    every block is sent; a sub-batch is sent when its prefix or one of its
    keys is kept, with only the kept keys.
    """
    try:
        values = _values(raw.get("updates") or {}, keep)
        deletes = _deletes(raw.get("deletes") or [], keep)
        batches: dict[str, bytes] = raw.get("batches") or {}
        subs: list[dict[str, Any]] = raw.get("subbatches") or []
        by_id = {s["id"]: s for s in subs}
        sent: list[str] = []
        sub_texts: list[str] = []
        for prefix, sub_id in batches.items():
            sub = by_id.get(sub_id)
            if sub is None:
                continue
            s_keep = None if keep is None or keep(prefix) else keep
            s_values = _values(sub.get("updates") or {}, s_keep)
            s_deletes = _deletes(sub.get("deletes") or [], s_keep)
            if s_keep is not None and not s_values and not s_deletes:
                continue
            if not isinstance(sub_id, bytes) or len(sub_id) != HASH_LEN:
                values.extend(s_values)  # not a types.Hash: fold it into the block
                deletes.extend(s_deletes)
                continue
            id_hex = "0x" + sub_id.hex()
            sent.append(f'{_dumps(prefix)}:"{id_hex}"')
            sub_texts.append(
                f'{{"type":"subbatch","subbatch":{{"hash":"0x{hash_hex}","batchid":"{id_hex}",'
                f'"values":{{{",".join(s_values)}}},"deletes":[{",".join(s_deletes)}]}}}}'
            )
    except (AttributeError, KeyError, TypeError) as exc:
        raise BadBatch(f"malformed block map: {exc!r}") from exc
    head = (
        f'{{"type":"batch","batch":{{"number":"0x{num:x}","weight":"0x{weight:x}",'
        f'"hash":"0x{hash_hex}","parent":"0x{parent_hex}","values":{{{",".join(values)}}},'
        f'"deletes":[{",".join(deletes)}],"batches":{{{",".join(sent)}}}}}}}'
    )
    return [head, *sub_texts]


def whole_block_result(raw: dict[str, Any], num: int, hash_hex: str, parent_hex: str) -> Any:
    """``cardinal_streamsBlock``'s result: one ``batch`` with every sub-batch folded in.

    As the library's ``StreamsBlock`` answers: ``batches`` empty, all values inline.
    """
    merged: dict[str, Any] = {
        "updates": dict(raw.get("updates") or {}),
        "deletes": list(raw.get("deletes") or []),
    }
    for sub in raw.get("subbatches") or []:
        merged["updates"].update(sub.get("updates") or {})
        merged["deletes"].extend(sub.get("deletes") or [])
    weight = effective_weight(num, raw_weight(raw))
    return json.loads(cardinal_results(merged, num, hash_hex, parent_hex, weight)[0])


def reorg_text(ancestor_num: int, ancestor_hash_hex: str) -> str:
    """``{"type":"reorg","batch":{"number","hash"}}`` naming the common ancestor."""
    return (
        f'{{"type":"reorg","batch":{{"number":"0x{ancestor_num:x}",'
        f'"hash":"0x{ancestor_hash_hex}"}}}}'
    )


# --- decoding (Sluice's consumer in the cardinal dialect) ----------------------------


def _object(obj: object, name: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadBatch(f"{name} must be an object")
    return obj


def _json_values(raw: object) -> dict[str, bytes]:
    if raw is None:
        return {}
    values = _object(raw, "values")
    out = {}
    for k, v in values.items():
        data = parse_data(v)
        if isinstance(v, str) and len(v) % 2:
            raise BadBatch(f"value of {k[:40]!r} is not even-length hex")
        out[k] = data
    return out


def _json_deletes(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(k, str) for k in raw):
        raise BadBatch("deletes must be a list of keys")
    return tuple(raw)


def parse_cardinal_batch(obj: object) -> BatchHeader:
    """Decode a ``{"type":"batch","batch":{...}}`` result (already parsed from JSON).

    A missing or null ``weight`` (a producer that sent none) leaves it None.
    """
    result = _object(obj, "result")
    batch = _object(result.get("batch"), "batch")
    try:
        weight = batch.get("weight")
        batches = batch.get("batches") or {}
        if not isinstance(batches, dict):
            raise BadBatch("batches must map prefixes to 0x ids")
        return BatchHeader(
            num=parse_quantity(batch["number"]),
            weight=None if weight is None else parse_weight(weight),
            hash=parse_hash(batch["hash"]),
            parent=parse_hash(batch["parent"]),
            updates=_json_values(batch.get("values")),
            deletes=_json_deletes(batch.get("deletes")),
            batches={str(p): parse_hash(i) for p, i in batches.items()},
        )
    except KeyError as exc:
        raise BadBatch(f"batch result is missing {exc.args[0]!r}") from exc


def parse_cardinal_subbatch(obj: object) -> tuple[bytes, SubBatch]:
    """Decode a ``{"type":"subbatch","subbatch":{...}}`` result: (block hash, sub-batch)."""
    sub = _object(_object(obj, "result").get("subbatch"), "subbatch")
    try:
        return parse_hash(sub["hash"]), SubBatch(
            id=parse_hash(sub["batchid"]),
            updates=_json_values(sub.get("values")),
            deletes=_json_deletes(sub.get("deletes")),
        )
    except KeyError as exc:
        raise BadBatch(f"subbatch result is missing {exc.args[0]!r}") from exc


def parse_cardinal_reorg(obj: object) -> tuple[int, bytes]:
    """(number, hash) of the common ancestor a ``reorg`` result names."""
    batch = _object(_object(obj, "result").get("batch"), "batch")
    try:
        return parse_quantity(batch["number"]), parse_hash(batch["hash"])
    except KeyError as exc:
        raise BadBatch(f"reorg result is missing {exc.args[0]!r}") from exc
