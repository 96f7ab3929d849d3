"""block_head reads what the lake needs of a block and refuses what decode_block refuses."""

from __future__ import annotations

import msgpack
import pytest

from pipeline.blockcodec import Block, SubBatch, decode_block, encode_block, weight_bytes32
from pipeline.errors import BadBatch
from pipeline.lake.intake.blockhead import HeadReader, block_head

H, P = b"\x01" * 32, b"\x02" * 32

VALID = [
    Block(num=0, hash=H, parent=P),
    Block(num=7, hash=H, parent=P, updates={"k": b"v"}, deletes=("d",), weight=0),
    Block(num=2**63 - 1, hash=H, parent=P, weight=2**256 - 1),
    Block(
        num=12,
        hash=H,
        parent=P,
        updates={f"c/{i}": bytes([i]) * 40 for i in range(60)},
        batches={"c/": b"\x03" * 32},
        subbatches=(SubBatch(id=b"\x03" * 32, updates={"c/x": b"y"}, deletes=("c/z",)),),
        weight=123456789,
    ),
]


def _body(**changes: object) -> bytes:
    body: dict[str, object] = {"num": 1, "hash": H, "parent": P, "updates": {}, "deletes": []}
    body.update(changes)
    return msgpack.packb({k: v for k, v in body.items() if v is not _DROP}, use_bin_type=True)


_DROP = object()

# Header faults: both decoders refuse, with the same message.
HEADER_FAULTS = [
    b"",
    b"\xc1",
    b"\x01",
    b"\x01\x02",
    _body() + b"\x00",
    encode_block(VALID[3])[:-1],
    b"\x90",
    _body(num=_DROP),
    _body(hash=_DROP),
    _body(parent=_DROP),
    _body(num=-1),
    _body(num=True),
    _body(num="1"),
    _body(num=2**63),
    _body(hash=b"x" * 31),
    _body(parent="y" * 32),
    _body(weight=b"\x01" * 33),
    _body(weight=5),
    _body(updates=None),
    _body(updates=[]),
    _body(deletes={}),
    _body(batches=[]),
    _body(subbatches={}),
]


@pytest.mark.parametrize("block", VALID, ids=lambda b: f"num{b.num}")
def test_head_matches_decode_block(block: Block) -> None:
    data = encode_block(block)
    decoded = decode_block(data)
    assert block_head(data) == (
        decoded.num,
        decoded.hash,
        decoded.parent,
        weight_bytes32(decoded.weight),
    )


@pytest.mark.parametrize("data", HEADER_FAULTS, ids=range(len(HEADER_FAULTS)))
def test_header_faults_refused_like_decode_block(data: bytes) -> None:
    with pytest.raises(BadBatch) as expected:
        decode_block(data)
    with pytest.raises(BadBatch) as got:
        block_head(data)
    assert str(got.value) == str(expected.value)


def test_body_contents_are_not_checked() -> None:
    # decode_block refuses a non-bytes update value; the head reader never looks inside.
    data = _body(updates={"k": 5})
    with pytest.raises(BadBatch):
        decode_block(data)
    assert block_head(data)[0] == 1


def test_one_reader_survives_failures() -> None:
    reader = HeadReader()
    good = [encode_block(b) for b in VALID]
    for bad in HEADER_FAULTS:
        with pytest.raises(BadBatch):
            reader.head(bad)
        assert [reader.head(g)[0] for g in good] == [b.num for b in VALID]
