"""The cardinal dialect's codec: the exact shape cardinal-streams v1.5.1 reads, and back."""

from __future__ import annotations

import json

import pytest

from pipeline.blockcodec import Block, SubBatch, block_raw, block_results
from pipeline.chain.cardinal import (
    READY,
    Encoding,
    cardinal_results,
    encode_results,
    encoding_for,
    parse_cardinal_batch,
    parse_cardinal_reorg,
    parse_cardinal_subbatch,
    reorg_text,
    whole_block_result,
)
from pipeline.chain.client.ordered import Added, OrderedChain, Removed
from pipeline.chain.serve.patterns import compile_patterns
from pipeline.errors import BadBatch

H1, H2, S1 = bytes.fromhex("42" * 32), bytes.fromhex("db" * 32), bytes.fromhex("fe" * 32)


def _block(weight: int | None = 0x1234_5678_9ABC_DEF0_1234) -> Block:
    sub = SubBatch(id=S1, updates={"s/k": b"\x01\x23\x40"}, deletes=("s/x",))
    return Block(
        num=0x1234, hash=H1, parent=H2, weight=weight, updates={"k": b"\x00"}, deletes=("k4",),
        batches={"s/": S1}, subbatches=(sub,),
    )  # fmt: skip


def test_shape_exactly_as_the_library_reads_it() -> None:
    block = _block()
    batch, sub = encode_results(block_raw(block), 0x1234, H1.hex(), H2.hex(), Encoding(None, True))
    assert json.loads(batch) == {
        "type": "batch",
        "batch": {
            "number": "0x1234",
            "weight": "0x123456789abcdef01234",
            "hash": "0x" + "42" * 32,
            "parent": "0x" + "db" * 32,
            "values": {"k": "0x00"},
            "deletes": ["k4"],
            "batches": {"s/": "0x" + "fe" * 32},
        },
    }
    assert json.loads(sub) == {
        "type": "subbatch",
        "subbatch": {
            "hash": "0x" + "42" * 32,
            "batchid": "0x" + "fe" * 32,
            "values": {"s/k": "0x012340"},
            "deletes": ["s/x"],
        },
    }
    assert json.loads(READY) == {"type": "ready"}
    assert json.loads(reorg_text(7, "ab" * 32)) == {
        "type": "reorg",
        "batch": {"number": "0x7", "hash": "0x" + "ab" * 32},
    }


def test_weightless_block_sends_num_plus_one_and_seed_stays_unchanged() -> None:
    block = _block(None)
    raw = block_raw(block)
    batch = json.loads(encode_results(raw, block.num, H1.hex(), H2.hex(), Encoding(None, True))[0])
    assert batch["batch"]["weight"] == "0x1235"
    assert encoding_for(None, "seed", False) is None  # the seed shape, untouched
    assert encode_results(raw, block.num, H1.hex(), H2.hex(), None) == block_results(block)
    with pytest.raises(ValueError, match="dialect"):
        encoding_for(None, "nope", False)


def test_short_subbatch_id_is_folded_into_the_batch() -> None:
    sub = SubBatch(id=b"short", updates={"s/a": b"\x01"}, deletes=("s/b",))
    block = Block(num=1, hash=H1, parent=H2, batches={"s/": b"short"}, subbatches=(sub,))
    texts = cardinal_results(block_raw(block), 1, H1.hex(), H2.hex(), 2)
    assert len(texts) == 1
    batch = json.loads(texts[0])["batch"]
    assert (batch["values"], batch["deletes"], batch["batches"]) == ({"s/a": "0x01"}, ["s/b"], {})


def test_filter_applies_as_in_the_seed_dialect() -> None:
    keep = compile_patterns(["^s/"])
    texts = encode_results(block_raw(_block()), 0x1234, H1.hex(), H2.hex(), Encoding(keep, True))
    batch = json.loads(texts[0])["batch"]
    assert batch["values"] == {} and batch["batches"] == {"s/": "0x" + "fe" * 32}
    assert Encoding(keep, True).cache_key != Encoding(keep, False, True).cache_key


def test_decode_round_trip_and_whole_block() -> None:
    block = _block()
    batch, sub = (json.loads(t) for t in block_results(block))  # seed shape is refused
    with pytest.raises(BadBatch):
        parse_cardinal_batch(batch)
    texts = cardinal_results(block_raw(block), block.num, H1.hex(), H2.hex(), block.weight or 0)
    header = parse_cardinal_batch(json.loads(texts[0]))
    block_hash, got = parse_cardinal_subbatch(json.loads(texts[1]))
    assert (header.num, header.weight, header.hash, header.batches) == (
        block.num, block.weight, H1, {"s/": S1},
    )  # fmt: skip
    assert block_hash == H1 and got == block.subbatches[0]
    whole = whole_block_result(block_raw(block), block.num, H1.hex(), H2.hex())
    assert whole["batch"]["values"] == {"k": "0x00", "s/k": "0x012340"}
    assert sorted(whole["batch"]["deletes"]) == ["k4", "s/x"] and whole["batch"]["batches"] == {}
    assert parse_cardinal_reorg(json.loads(reorg_text(7, "ab" * 32))) == (7, b"\xab" * 32)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("weight", "0x01"),
        ("weight", "0x" + "1" * 65),
        ("weight", "-0x1"),
        ("hash", "0x" + "42" * 33),
        ("number", "12"),
        ("values", {"k": "0x123"}),
        ("batches", {"s/": "0x12"}),
    ],
)
def test_bad_fields_are_refused(field: str, value: object) -> None:
    obj = json.loads(cardinal_results(block_raw(_block()), 1, H1.hex(), H2.hex(), 5)[0])
    obj["batch"][field] = value
    with pytest.raises(BadBatch):
        parse_cardinal_batch(obj)


def test_ordered_chain_follows_a_named_ancestor() -> None:
    blocks = []
    parent = H2
    for n in range(5):
        blocks.append(Block(num=n, hash=bytes([n + 1]) * 32, parent=parent))
        parent = blocks[-1].hash
    chain = OrderedChain()
    for b in blocks:
        chain.accept(b)
    assert chain.reorg_to(4, blocks[4].hash) == []  # the head itself: nothing
    assert chain.reorg_to(2, blocks[2].hash) == [
        Removed(num=4, hash=blocks[4].hash),
        Removed(num=3, hash=blocks[3].hash),
    ]
    lighter = Block(num=3, hash=b"\x33" * 32, parent=blocks[2].hash, weight=1)
    assert chain.accept(lighter) == [Added(block=lighter)]  # extends the named ancestor
