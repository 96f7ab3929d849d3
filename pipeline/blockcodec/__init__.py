"""Block batches: the pure codec (msgpack for Redis, the seed's JSON for websockets).

:mod:`~pipeline.blockcodec.block` holds a block and its msgpack form (one
Redis stream entry per block, decoded within bounds);
:mod:`~pipeline.blockcodec.seedjson` writes the seed's JSON form and
:mod:`~pipeline.blockcodec.seedparse` reads it back. Every name is also
importable from here (``from pipeline.blockcodec import decode_block``).

It sits at the bottom of the layers, beside the other pure codecs: the chain
part and the lake both decode blocks with it, so the lake never imports the
chain part. Loading it loads msgpack and nothing with I/O.
"""

from __future__ import annotations

from pipeline.blockcodec.block import (
    ENTRY_FIELD,
    HASH_LEN,
    MAX_BLOCK_NUM,
    MAX_DEPTH,
    MAX_ENTRY_BYTES,
    MAX_ITEMS,
    MAX_WEIGHT_BITS,
    WEIGHT_BYTES,
    Block,
    SubBatch,
    block_raw,
    check_raw,
    check_weight,
    decode_block,
    decode_raw,
    effective_weight,
    encode_block,
    raw_weight,
    weight_bytes32,
    weight_from_bytes,
    weight_to_bytes,
)

# The catch-up path's inlined fast path (pipeline/chain/history/plainblock.py) shares the
# encoder's key cache: re-exported under their own names, as before the split.
from pipeline.blockcodec.seedjson import _KEY_CACHE as _KEY_CACHE
from pipeline.blockcodec.seedjson import (
    KeyTest,
    block_results,
    hex_data,
    hex_quantity,
    raw_results,
)
from pipeline.blockcodec.seedjson import (
    _filtered_or_nested_results as _filtered_or_nested_results,
)
from pipeline.blockcodec.seedjson import _key_json as _key_json
from pipeline.blockcodec.seedparse import (
    BatchHeader,
    assemble,
    block_from_json,
    parse_batch_result,
    parse_data,
    parse_hash,
    parse_quantity,
    parse_subbatch_result,
    parse_weight,
)

__all__ = [
    "ENTRY_FIELD",
    "HASH_LEN",
    "MAX_BLOCK_NUM",
    "MAX_DEPTH",
    "MAX_ENTRY_BYTES",
    "MAX_ITEMS",
    "MAX_WEIGHT_BITS",
    "WEIGHT_BYTES",
    "BatchHeader",
    "Block",
    "KeyTest",
    "SubBatch",
    "assemble",
    "block_from_json",
    "block_raw",
    "block_results",
    "check_raw",
    "check_weight",
    "decode_block",
    "decode_raw",
    "effective_weight",
    "encode_block",
    "hex_data",
    "hex_quantity",
    "parse_batch_result",
    "parse_data",
    "parse_hash",
    "parse_quantity",
    "parse_subbatch_result",
    "parse_weight",
    "raw_results",
    "raw_weight",
    "weight_bytes32",
    "weight_from_bytes",
    "weight_to_bytes",
]
