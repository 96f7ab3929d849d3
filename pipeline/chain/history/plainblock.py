"""The plain block's notification text straight from its msgpack payload (catch-up's fast path).

Most blocks a catch-up sends are *plain*: no sub-batches, sent to a
subscriber without a key filter in the seed dialect. For those,
:func:`plain_results` decodes the payload with msgspec into a typed struct
(no dict per block, only the fields the text needs; about half the time of
:func:`~pipeline.blockcodec.decode_raw`, the largest single cost of a
catch-up: ``catchup_cpu_us_per_block`` of ``make bench B=resume``) and
writes the same text as :func:`~pipeline.blockcodec.raw_results`, byte for
byte.

It answers only where it is sure to agree with ``decode_raw`` then
``raw_results``: a payload of at most :data:`MAX_FAST_BYTES` (then no map or
list in it can exceed :data:`~pipeline.blockcodec.MAX_ITEMS`, the general
decoder's bound), exactly the keys :func:`~pipeline.blockcodec.encode_block`
writes with the types it writes, no sub-batches, a weight of at most 32
bytes. Anything else returns None and the caller takes the general path,
which gives the text or the :class:`~pipeline.errors.BadBatch` it always
gave (``tests/unit/chain/test_plainblock.py`` checks the two agree on
arbitrary msgpack).

Pure: no I/O.
"""

from __future__ import annotations

import msgspec

from pipeline.blockcodec import _KEY_CACHE, MAX_ITEMS, WEIGHT_BYTES, _key_json

#: Longest payload decoded here: each item of a msgpack map or list takes at least
#: one byte, so none of a payload this long can hold more than MAX_ITEMS of them.
MAX_FAST_BYTES = MAX_ITEMS


class _Body(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The map :func:`~pipeline.blockcodec.encode_block` writes (every key optional)."""

    num: int = 0
    hash: bytes = b""
    parent: bytes = b""
    weight: bytes | None = None
    updates: dict[str, bytes] = {}
    deletes: list[str] = []
    batches: dict[str, bytes] = {}
    #: Left undecoded: a block with sub-batches takes the general path.
    subbatches: list[msgspec.Raw] = []


_decode = msgspec.msgpack.Decoder(_Body).decode
#: (msgspec raises UnicodeDecodeError itself for a str that is not UTF-8)
_errors = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)


def plain_results(
    payload: bytes, num: int, hash_hex: str, parent_hex: str
) -> tuple[list[str], int] | None:
    """(``raw_results(decode_raw(payload), num, hash_hex, parent_hex)``, the block's effective
    weight), or None where this path cannot tell (see the module doc)."""
    if len(payload) > MAX_FAST_BYTES:
        return None
    try:
        body = _decode(payload)
    except _errors:
        return None
    if body.subbatches:
        return None
    stored = body.weight
    if stored is None:
        weight = num + 1
    elif len(stored) > WEIGHT_BYTES:
        return None
    else:
        weight = int.from_bytes(stored, "big")
    cache, kj = _KEY_CACHE, _key_json
    updates, deletes = body.updates, body.deletes
    u_text = (
        ",".join([f'{cache.get(k) or kj(k)}:"0x{v.hex()}"' for k, v in updates.items()])
        if updates
        else ""
    )
    d_text = ",".join([cache.get(k) or kj(k) for k in deletes]) if deletes else ""
    return [
        f'{{"type":"batch","num":"0x{num:x}","hash":"0x{hash_hex}",'
        f'"parent":"0x{parent_hex}","updates":{{{u_text}}},"deletes":[{d_text}],"batches":{{}}}}'
    ], weight


__all__ = ["MAX_FAST_BYTES", "plain_results"]
