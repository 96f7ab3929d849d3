from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.blockcodec import (
    Block,
    SubBatch,
    _filtered_or_nested_results,
    block_from_json,
    block_results,
    hex_quantity,
    parse_data,
    parse_hash,
    parse_quantity,
    raw_results,
)
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.serve.patterns import compile_patterns
from pipeline.errors import BadBatch

H1, H2, S1 = bytes.fromhex("42" * 32), bytes.fromhex("db" * 32), bytes.fromhex("fe" * 32)


def seed_block() -> Block:
    sub = SubBatch(id=S1, updates={"s/k": b"\x01\x23\x40", "s/k2": b"\x56\x78"}, deletes=())
    return Block(
        num=0x1234,
        hash=H1,
        parent=H2,
        updates={"k": b"\x01\x23\x40", "k2": b"\x56\x78"},
        deletes=("k4", "k5"),
        batches={"s/": S1},
        subbatches=(sub,),
    )


def test_seed_shape_exactly() -> None:
    batch, sub = [json.loads(t) for t in block_results(seed_block())]
    assert batch == {
        "type": "batch",
        "num": "0x1234",
        "hash": "0x" + "42" * 32,
        "parent": "0x" + "db" * 32,
        "updates": {"k": "0x012340", "k2": "0x5678"},
        "deletes": ["k4", "k5"],
        "batches": {"s/": "0x" + "fe" * 32},
    }
    assert sub == {
        "type": "subbatch",
        "hash": "0x" + "42" * 32,
        "id": "0x" + "fe" * 32,
        "updates": {"s/k": "0x012340", "s/k2": "0x5678"},
        "deletes": [],
    }
    assert list(batch) == ["type", "num", "hash", "parent", "updates", "deletes", "batches"]


def test_round_trip_generated_blocks() -> None:
    for block in SyntheticChain(seed=3, prefixes=("s/", "t/")).take(20):
        assert block_from_json(block_results(block, with_weight=True)) == block


keys = st.text(min_size=1, max_size=8)


@given(
    num=st.integers(0, 2**63 - 1),
    updates=st.dictionaries(keys, st.binary(max_size=8), max_size=4),
    deletes=st.lists(keys, max_size=3),
    sub_updates=st.dictionaries(keys, st.binary(max_size=8), max_size=3),
)
def test_round_trip_property(num, updates, deletes, sub_updates) -> None:
    sub = SubBatch(id=b"\x07" * 32, updates=sub_updates)
    block = Block(
        num=num,
        hash=H1,
        parent=H2,
        updates=updates,
        deletes=tuple(deletes),
        batches={'p"/\\': sub.id},
        subbatches=(sub,),
    )
    assert block_from_json(block_results(block)) == block


def test_seed_odd_length_value_reads_with_a_leading_zero() -> None:
    assert parse_data("0x01234") == b"\x00\x12\x34"


@pytest.mark.parametrize("bad", ["1234", "0x", "0xzz", "0x" + "1" * 17, 12, None, "0X12"])
def test_bad_quantities(bad) -> None:
    with pytest.raises(BadBatch):
        parse_quantity(bad)


def test_quantity_round_trip() -> None:
    for n in (0, 1, 255, 2**63):
        assert parse_quantity(hex_quantity(n)) == n
    assert hex_quantity(0) == "0x0"


@pytest.mark.parametrize("bad", ["0x12", "0x" + "g" * 64, "42" * 32, 5])
def test_bad_hashes(bad) -> None:
    with pytest.raises(BadBatch):
        parse_hash(bad)


def test_filter_applies_to_updates_deletes_and_subbatches() -> None:
    block = Block(
        num=1,
        hash=H1,
        parent=H2,
        updates={"a/x": b"\x01", "b/y": b"\x02"},
        deletes=("a/z", "c/w"),
        batches={"s/": S1, "t/": H2},
        subbatches=(
            SubBatch(id=S1, updates={"s/k": b"\x03"}, deletes=("s/d",)),
            SubBatch(id=H2, updates={"t/k": b"\x04", "t/a/q": b"\x05"}),
        ),
    )
    keep = compile_patterns(["a/", "t/a/"])
    texts = [json.loads(t) for t in block_results(block, keep)]
    batch, *subs = texts
    assert batch["updates"] == {"a/x": "0x01"}
    assert batch["deletes"] == ["a/z"]
    assert batch["batches"] == {"t/": "0x" + H2.hex()}  # s/ has nothing kept: not listed, not sent
    assert subs == [
        {"type": "subbatch", "hash": "0x" + H1.hex(), "id": "0x" + H2.hex(),
         "updates": {"t/a/q": "0x05"}, "deletes": []}
    ]  # fmt: skip
    # a pattern matching the sub-batch prefix keeps the whole sub-batch
    whole = [json.loads(t) for t in block_results(block, compile_patterns(["s/"]))]
    assert whole[0]["updates"] == {} and whole[0]["batches"] == {"s/": "0x" + S1.hex()}
    assert whole[1]["updates"] == {"s/k": "0x03"} and whole[1]["deletes"] == ["s/d"]


def test_malformed_json_blocks_are_refused() -> None:
    good = block_results(seed_block())
    with pytest.raises(BadBatch, match="sub-batches missing"):
        block_from_json(good[:1])
    broken = json.loads(good[0])
    del broken["hash"]
    with pytest.raises(BadBatch, match="missing 'hash'"):
        block_from_json([json.dumps(broken)])
    with pytest.raises(BadBatch):
        block_from_json([good[1]])


def test_block_numbers_past_int64_are_refused() -> None:
    """The lake stores num as int64: a larger number is a bad batch, never a crash later."""
    from pipeline.blockcodec import MAX_BLOCK_NUM

    Block(num=MAX_BLOCK_NUM, hash=b"\x01" * 32, parent=b"\x00" * 32)
    with pytest.raises(BadBatch, match="past"):
        Block(num=MAX_BLOCK_NUM + 1, hash=b"\x01" * 32, parent=b"\x00" * 32)


@given(
    num=st.integers(0, 2**63 - 1),
    updates=st.dictionaries(st.text(max_size=8), st.binary(max_size=8), max_size=4),
    deletes=st.lists(st.text(max_size=8), max_size=3),
    weight=st.none() | st.integers(0, 2**256 - 1),
)
def test_the_plain_block_fast_path_writes_the_general_paths_text(
    num, updates, deletes, weight
) -> None:
    """A block without sub-batches and without a filter takes raw_results' fast path: the
    same bytes as the general path (non-ASCII and quotes escaped the same way)."""
    raw = {"updates": updates, "deletes": deletes}
    fast = raw_results(raw, num, "42" * 32, "db" * 32, None, weight)
    general = _filtered_or_nested_results(raw, num, "42" * 32, "db" * 32, None, weight)
    assert fast == general
    assert json.loads(fast[0])["updates"] == {k: "0x" + v.hex() for k, v in updates.items()}


def test_the_fast_path_refuses_malformed_maps_as_the_general_path() -> None:
    for raw in ({"updates": ["k"]}, {"updates": {"k": 1}}, {"deletes": [["k"]]}):
        with pytest.raises(BadBatch):
            raw_results(raw, 1, "42" * 32, "db" * 32)
