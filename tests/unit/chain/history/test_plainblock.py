"""The plain block's fast path agrees with decode_raw then raw_results, byte for byte."""

from __future__ import annotations

import msgpack
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.blockcodec import (
    MAX_ITEMS,
    Block,
    SubBatch,
    decode_raw,
    effective_weight,
    encode_block,
    raw_results,
    raw_weight,
)
from pipeline.chain.history.plainblock import MAX_FAST_BYTES, plain_results
from pipeline.errors import BadBatch

H, P = "42" * 32, "db" * 32


def general(payload: bytes, num: int) -> tuple[list[str], int] | None:
    """What the general path gives (None for BadBatch)."""
    try:
        raw = decode_raw(payload)
        return raw_results(raw, num, H, P), effective_weight(num, raw_weight(raw))
    except BadBatch:
        return None


def agrees(payload: bytes, num: int) -> tuple[list[str], int] | None:
    fast = plain_results(payload, num, H, P)
    if fast is not None:
        assert fast == general(payload, num)
    return fast


keys = st.text(max_size=6) | st.sampled_from(["k", "é", 'q"', "a\\b", "\x00", "\u2028", "😀"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.binary(max_size=40)
    | keys
)
anything = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(keys | st.integers(0, 9) | st.binary(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
updates = st.dictionaries(keys, st.binary(max_size=12), max_size=4) | anything
deletes = st.lists(keys, max_size=3) | anything
subs = st.just([]) | st.lists(
    st.fixed_dictionaries({"id": st.binary(min_size=1, max_size=4), "updates": updates}), max_size=2
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "num": st.integers(0, 2**63 - 1) | anything,
        "hash": st.binary(min_size=32, max_size=32) | anything,
        "parent": st.binary(min_size=32, max_size=32) | anything,
        "weight": st.none() | st.binary(max_size=34) | anything,
        "updates": updates,
        "deletes": deletes,
        "batches": st.dictionaries(keys, st.binary(max_size=4), max_size=2) | anything,
        "subbatches": subs | anything,
        "extra": anything,
    },
)


@settings(max_examples=600, deadline=None)
@given(body=bodies, num=st.integers(0, 2**63 - 1))
def test_any_block_map_gives_the_general_paths_text_or_none(body, num) -> None:
    agrees(msgpack.packb(body, use_bin_type=True), num)


@settings(max_examples=300, deadline=None)
@given(body=bodies, num=st.integers(0, 2**20), cut=st.integers(0, 400), tail=st.binary(max_size=3))
def test_cut_or_padded_payloads_agree(body, num, cut, tail) -> None:
    payload = msgpack.packb(body, use_bin_type=True)
    agrees(payload[:cut], num)
    agrees(payload + tail, num)


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=64), num=st.integers(0, 2**20))
@example(payload=b"\x81\xa3\x00\x00\x80", num=0)  # a str that is not UTF-8 (found in CI)
def test_arbitrary_bytes_agree(payload, num) -> None:
    agrees(payload, num)


@settings(max_examples=300, deadline=None)
@given(
    num=st.integers(0, 2**63 - 1),
    updates=st.dictionaries(keys, st.binary(max_size=12), max_size=5),
    deletes=st.lists(keys, max_size=4),
    weight=st.none() | st.integers(0, 2**256 - 1),
)
def test_a_plain_block_takes_the_fast_path(num, updates, deletes, weight) -> None:
    block = Block(
        num=num,
        hash=bytes.fromhex(H),
        parent=bytes.fromhex(P),
        updates=updates,
        deletes=tuple(deletes),
        weight=weight,
    )
    fast = agrees(encode_block(block), num)
    assert fast is not None
    assert fast[1] == effective_weight(num, weight)


def test_sub_batches_and_long_payloads_take_the_general_path() -> None:
    sub = SubBatch(id=b"\x01", updates={"s/k": b"\x02"})
    block = Block(
        num=5,
        hash=bytes(32),
        parent=bytes(32),
        batches={"s/": b"\x01"},
        subbatches=(sub,),
    )
    assert plain_results(encode_block(block), 5, H, P) is None
    assert general(encode_block(block), 5) is not None
    # Past MAX_FAST_BYTES a list may hold more than MAX_ITEMS items: never decoded here.
    many = Block(num=5, hash=bytes(32), parent=bytes(32), deletes=("",) * (MAX_ITEMS + 1))
    payload = encode_block(many)
    assert len(payload) > MAX_FAST_BYTES
    assert plain_results(payload, 5, H, P) is None
    assert general(payload, 5) is None  # refused by the general decoder's item bound
