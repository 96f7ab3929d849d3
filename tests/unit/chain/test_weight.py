"""Block weight: the msgpack ``weight`` key, its bounds, the seed opt-in and the generator."""

from __future__ import annotations

import json

import msgpack
import pytest

from pipeline.blockcodec import (
    Block,
    block_from_json,
    block_raw,
    block_results,
    decode_block,
    effective_weight,
    encode_block,
    raw_results,
    weight_bytes32,
)
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.errors import BadBatch

H1, H2 = bytes.fromhex("42" * 32), bytes.fromhex("db" * 32)


def _block(weight: int | None) -> Block:
    return Block(num=7, hash=H1, parent=H2, weight=weight)


@pytest.mark.parametrize("weight", [0, 1, 255, 256, 2**64, 2**256 - 1])
def test_weight_round_trips_as_minimal_big_endian_bin(weight: int) -> None:
    data = encode_block(_block(weight))
    raw = msgpack.unpackb(data, raw=False)
    assert raw["weight"] == weight.to_bytes((weight.bit_length() + 7) // 8, "big")
    assert decode_block(data).weight == weight


def test_block_without_weight_has_no_key_and_weighs_num_plus_one() -> None:
    data = encode_block(_block(None))
    assert "weight" not in msgpack.unpackb(data, raw=False)
    assert decode_block(data).weight is None
    assert effective_weight(7, None) == 8 and effective_weight(7, 3) == 3


@pytest.mark.parametrize("bad", [-1, 2**256, True, 1.5, "0x1"])
def test_out_of_bounds_weight_is_bad_batch(bad: object) -> None:
    with pytest.raises(BadBatch, match="weight"):
        _block(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("stored", [b"\x01" * 33, 5, "0x05", [1]])
def test_bad_stored_weight_is_bad_batch(stored: object) -> None:
    raw = msgpack.unpackb(encode_block(_block(None)), raw=False)
    raw["weight"] = stored
    with pytest.raises(BadBatch, match="weight"):
        decode_block(msgpack.packb(raw, use_bin_type=True))


def test_lake_form_is_32_bytes_in_numeric_order() -> None:
    assert weight_bytes32(None) is None
    values = [0, 1, 255, 256, 2**200, 2**256 - 1]
    forms = [weight_bytes32(v) for v in values]
    assert all(f is not None and len(f) == 32 for f in forms)
    assert forms == sorted(forms)  # type: ignore[type-var]


def test_seed_shape_unchanged_unless_weight_is_asked_for() -> None:
    block = _block(300)
    plain = block_results(block)
    assert "weight" not in plain[0]
    raw = block_raw(block)
    weighted = raw_results(raw, 7, H1.hex(), H2.hex(), None, 300)
    obj = json.loads(weighted[0])
    assert obj["weight"] == "0x12c" and list(obj)[:3] == ["type", "num", "weight"]
    assert block_from_json(weighted).weight == 300
    assert block_from_json(plain).weight is None


@pytest.mark.parametrize("bad", ["0x012c", "12c", "0x", "0xzz", "0x1" + "0" * 64, 300])
def test_bad_weight_in_json_is_refused(bad: object) -> None:
    obj = json.loads(raw_results(block_raw(_block(300)), 7, H1.hex(), H2.hex(), None, 300)[0])
    obj["weight"] = bad
    with pytest.raises(BadBatch, match="weight"):
        block_from_json([json.dumps(obj)])


def _is_heaviest(chain: SyntheticChain) -> bool:
    head = chain.canonical[-1]
    assert head.weight is not None
    return all(b.weight is not None and b.weight <= head.weight for b in chain.emitted)


def test_generator_weights_increase_and_reorgs_are_heavier() -> None:
    chain = SyntheticChain(seed=3, reorg_every=4, reorg_depth=3)
    chain.take(60)
    for parent, child in zip(chain.canonical, chain.canonical[1:], strict=False):
        assert child.weight is not None and parent.weight is not None
        assert child.weight > parent.weight and child.parent == parent.hash
    assert chain.reorgs > 0 and _is_heaviest(chain)


def test_generator_shorter_heavier_reorg() -> None:
    chain = SyntheticChain(seed=5)
    chain.take(10)
    old_head = chain.canonical[-1]
    branch = chain.reorg(4, 2)
    assert [b.num for b in branch] == [6, 7]
    assert branch[-1].weight is not None and old_head.weight is not None
    assert branch[-1].weight > old_head.weight
    assert chain.canonical[-1] == branch[-1] and len(chain.canonical) == 8
    assert _is_heaviest(chain)
    with pytest.raises(ValueError):
        chain.reorg(8, 0)
