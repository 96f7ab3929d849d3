"""Chain-stream entries are bounded before they are decoded, and fuzzed decoders only refuse.

The hostile entries of issue 21 (a 20 MB value, a block with a million keys,
100,000-deep msgpack, wrong types) are refused with :class:`BadBatch` by the
block codec, by length or by msgpack header, before Python builds anything;
whatever bytes come, the decoders raise nothing else.
"""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.blockcodec import (
    ENTRY_FIELD,
    MAX_ENTRY_BYTES,
    MAX_ITEMS,
    Block,
    check_raw,
    decode_block,
    decode_raw,
    encode_block,
)
from pipeline.chain.history.entries import Refusals
from pipeline.chain.metrics import Metrics
from pipeline.chain.tailindex import TailIndex, index_entry
from pipeline.errors import BadBatch

H = b"\x01" * 32


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def _block(**fields: object) -> dict[str, object]:
    return {"num": 1, "hash": H, "parent": b"\x00" * 32, **fields}


def _million_keys() -> bytes:
    # the header of a map of 1,000,000 entries, then the entries themselves
    body = b"".join(_pack(f"k{i}") + b"\xc4\x00" for i in range(1_000_000))
    updates = b"\xdf" + (1_000_000).to_bytes(4, "big") + body
    head = _pack(_block())
    # the block map with one more key ("updates") appended to the header's count
    assert head[0] == 0x83
    return b"\x84" + head[1:] + _pack("updates") + updates


HOSTILE = {
    "20 MB value": _pack(_block(updates={"k": b"\x00" * (20 << 20)})),
    "a million keys": _million_keys(),
    "100,000-deep": b"\x91" * 100_000 + b"\xc0",
    "deep inside a block": b"\x84" + _pack(_block())[1:] + _pack("updates") + b"\x91" * 5000,
    "num a string": _pack(_block(num="1")),
    "hash an int": _pack(_block(hash=7)),
    "updates a list": _pack(_block(updates=[1, 2])),
    "update value a str": _pack(_block(updates={"k": "v"})),
    "deletes a map": _pack(_block(deletes={"k": b""})),
    "subbatch id an int": _pack(_block(subbatches=[{"id": 5}])),
    "subbatch a list": _pack(_block(subbatches=[[1]])),
    "batches values int": _pack(_block(batches={"p": 1})),
    "weight a str": _pack(_block(weight="heavy")),
    "not a map": _pack([1, 2, 3]),
    "ext type": _pack(msgpack.ExtType(1, b"x" * 100)),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_entries_are_refused_by_both_decoders(name: str) -> None:
    data = HOSTILE[name]
    with pytest.raises(BadBatch):
        decode_block(data)
    with pytest.raises(BadBatch):
        check_raw(decode_raw(data))


def test_the_length_is_checked_before_decoding() -> None:
    # not even msgpack: refused on its length alone
    with pytest.raises(BadBatch, match="at most"):
        decode_raw(b"\xc0" * (MAX_ENTRY_BYTES + 1))


def test_a_map_longer_than_the_bound_is_refused_from_its_header() -> None:
    header_only = b"\xdf" + (MAX_ITEMS + 1).to_bytes(4, "big")  # no entries follow
    with pytest.raises(BadBatch):
        decode_raw(header_only)


def test_blocks_within_the_bounds_still_decode() -> None:
    updates = {f"k{i}": b"v" for i in range(MAX_ITEMS)}
    block = Block(num=3, hash=H, parent=H, updates=updates, deletes=("x",), weight=9)
    data = encode_block(block)
    assert decode_block(data) == block
    check_raw(decode_raw(data))


def test_the_index_skips_hostile_entries_and_reports_each_once() -> None:
    metrics = Metrics()
    refusals = Refusals(metrics)
    tail = TailIndex()
    good = Block(num=0, hash=H, parent=b"\x00" * 32)
    assert index_entry(tail, b"1-0", {ENTRY_FIELD: encode_block(good)}, refusals) == (0, H.hex())
    for i, name in enumerate(sorted(HOSTILE)):
        entry_id = f"{i + 2}-0".encode()
        assert index_entry(tail, entry_id, {ENTRY_FIELD: HOSTILE[name]}, refusals) is None
        refusals(entry_id, BadBatch("met again by another reader"))  # counted once
    assert refusals.count == len(HOSTILE)
    assert metrics.values["sluice_serve_entries_refused_total"] == len(HOSTILE)
    assert list(tail.chain) == [0] and tail.last_id == f"{len(HOSTILE) + 1}-0".encode()


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.binary(max_size=40),
    st.text(max_size=8),
    st.floats(allow_nan=False),
)
_value = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_keys = st.sampled_from(
    ["num", "hash", "parent", "updates", "deletes", "batches", "subbatches", "weight", "x"]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_keys, _value, max_size=8))
def test_fuzzed_block_maps_only_raise_badbatch(raw: dict[str, object]) -> None:
    data = _pack(raw)
    outcomes = []
    for decode in (decode_block, lambda d: check_raw(decode_raw(d))):
        try:
            decode(data)
            outcomes.append(True)
        except BadBatch:
            outcomes.append(False)
    assert outcomes[0] == outcomes[1]  # the fast path's check agrees with the full decoder


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_fuzzed_bytes_only_raise_badbatch(data: bytes) -> None:
    for decode in (decode_block, decode_raw):
        with contextlib.suppress(BadBatch):
            decode(data)
