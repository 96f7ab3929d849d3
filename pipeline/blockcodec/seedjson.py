"""The seed's JSON form of a block, written: one ``batch`` result, then one ``subbatch`` result each.

Quantities are ``0x`` hex without leading zeros, hashes, ids and values
``0x`` hex bytes, exactly as seed 004 shows them. The encoders work on the
raw msgpack map (:func:`pipeline.blockcodec.block.decode_raw`) so the
catch-up path never builds a :class:`~pipeline.blockcodec.block.Block` per
row; :mod:`pipeline.blockcodec.seedparse` reads the form back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pipeline.blockcodec.block import Block, block_raw, effective_weight
from pipeline.errors import BadBatch

_json_dumps = json.JSONEncoder(separators=(",", ":")).encode

#: A key filter: ``keep(key) -> bool`` (see ``pipeline.chain.serve.patterns``).
KeyTest = Callable[[str], bool]


def hex_quantity(value: int) -> str:
    """``0x`` hex without leading zeros (``0x0`` for zero)."""
    return f"0x{value:x}"


def hex_data(value: bytes) -> str:
    """``0x`` hex bytes."""
    return "0x" + value.hex()


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
    # text as the general path, byte for byte (tests/unit/test_blockcodec.py).
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


def block_results(
    block: Block, keep: KeyTest | None = None, *, with_weight: bool = False
) -> list[str]:
    """:func:`raw_results` for a :class:`Block` (``with_weight``: its effective weight too)."""
    weight = effective_weight(block.num, block.weight) if with_weight else None
    return raw_results(
        block_raw(block), block.num, block.hash.hex(), block.parent.hex(), keep, weight
    )
