"""Live frames: encoded once per block and shared, byte for byte what each subscriber's own encoding gives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.blockcodec import Block, SubBatch
from pipeline.chain import jsonrpc
from pipeline.chain.burst import frame_texts
from pipeline.chain.cardinal import CARDINAL, SEED, encode_results
from pipeline.chain.outbox import Outbox
from pipeline.chain.planning import Emit
from pipeline.chain.produce import producer
from pipeline.chain.produce.producer import UNSHARED, LiveBlock, share_key
from pipeline.chain.serve import frames
from pipeline.chain.serve.frames import encode_frames, frames_for
from pipeline.chain.serve.subscription import METHOD, Subscription, parse_subscribe

H = "0x" + "00" * 32


def _block(num: int = 7) -> Block:
    return Block(
        num=num,
        hash=bytes([num]) * 32,
        parent=bytes([num - 1]) * 32,
        weight=1000 + num,
        updates={"acct/1": b"\x01\x02", "slot/9": b"\xff", 'q"uote': b"\x00"},
        deletes=("acct/2", "tmp/x"),
        batches={"acct/": b"\x0a" * 32, "slot/": b"\x0b" * 32},
        subbatches=(
            SubBatch(id=b"\x0a" * 32, updates={"acct/3": b"\x03"}, deletes=("acct/4",)),
            SubBatch(id=b"\x0b" * 32, updates={"slot/1": b"\x04"}),
        ),
    )


def _sub(
    sub_id: str, dialect: str, patterns: list[str], weight: bool = False, **kw: Any
) -> Subscription:
    options = {"weight": True} if weight else {}
    params = parse_subscribe(["streams", "0x0", H, patterns, options])
    return Subscription(sub_id, params, Outbox(64), dialect=dialect, **kw)


def _old_frames(block: Block, sub: Subscription, sub_id: str) -> list[bytes]:
    """What a subscriber's own encoding of the block gives (the encoder before frames were shared)."""
    results = encode_results(
        LiveBlock.from_block(block).raw, block.num, block.hash.hex(), block.parent.hex(), sub.keep
    )
    prefix = jsonrpc.notification_prefix(METHOD, sub_id)
    return [(prefix + r + jsonrpc.NOTIFICATION_SUFFIX).encode() for r in results]


def _live(sub: Subscription, item: LiveBlock) -> list[bytes]:
    sub.put_nowait([item.emit(sub.keep, share_key(sub.keep))])
    return sub._outbox.pop_many(100)


SHAPES = [
    (SEED, [], False),
    (SEED, ["acct/"], False),
    (SEED, [], True),
    (SEED, ["slot/", "q"], True),
    (CARDINAL, [], False),
    (CARDINAL, ["acct/"], False),
]


@pytest.mark.parametrize(("dialect", "patterns", "weight"), SHAPES)
def test_shared_frames_equal_each_subscribers_own_encoding(
    dialect: str, patterns: list[str], weight: bool
) -> None:
    block = _block()
    item = LiveBlock.from_block(block)
    a = _sub("0x1", dialect, patterns, weight)
    b = _sub("0x1", dialect, patterns, weight)  # the same id on another connection
    c = _sub("0x2", dialect, patterns, weight)
    got_a, got_b, got_c = _live(a, item), _live(b, item), _live(c, item)
    assert got_a == _old_frames(block, a, "0x1") and got_c == _old_frames(block, c, "0x2")
    assert got_a == got_b and all(x is y for x, y in zip(got_a, got_b, strict=True))
    assert not any(x is y for x, y in zip(got_a, got_c, strict=True))
    for frame in got_c:
        note = json.loads(frame)
        assert note["method"] == METHOD and note["params"]["subscription"] == "0x2"
    if patterns:
        kept = json.loads(got_a[0])["params"]["result"]
        values = kept["batch"]["values"] if dialect == CARDINAL else kept["updates"]
        assert all(any(k.startswith(p) for p in patterns) for k in values)


def test_filters_and_dialects_do_not_share_frames() -> None:
    item = LiveBlock.from_block(_block())
    seen = [_live(_sub("0x1", d, p, w), item)[0] for d, p, w in SHAPES]
    assert len({id(f) for f in seen}) == len(SHAPES)
    assert len(set(seen)) == len(SHAPES)  # and the bytes differ too


def test_cardinal_announce_and_reorg_frames_come_first_then_the_shared_ones() -> None:
    block = _block()
    item = LiveBlock.from_block(block)
    sub = _sub("0x1", CARDINAL, [], announce=True)
    got = _live(sub, item)
    assert json.loads(got[0])["params"]["result"] == {
        "type": "reorg",
        "batch": {"number": hex(block.num - 1), "hash": "0x" + block.parent.hex()},
    }
    assert got[1:] == _old_frames(block, sub, "0x1")
    again = _live(sub, LiveBlock.from_block(_block(8)))  # announced once only
    assert json.loads(again[0])["params"]["result"]["type"] == "batch"


def test_bare_results_for_the_dialogue_feed() -> None:
    block = _block()
    item = LiveBlock.from_block(block)
    params = parse_subscribe(["streams", "0x0", H, []])
    sub = Subscription("0x1", params, Outbox(8), envelope=False)
    raw = item.raw
    expected = [r.encode() for r in encode_results(raw, block.num, item.hash, item.parent, None)]
    assert _live(sub, item) == expected


def test_shapes_per_block_are_bounded_and_frames_stay_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(frames, "SHAPES_PER_BLOCK", 3)
    block = _block()
    item = LiveBlock.from_block(block)
    for n in range(1, 11):
        sub = _sub(hex(n), SEED, [])
        assert _live(sub, item) == _old_frames(block, sub, hex(n))
    emit = item.emit(None, share_key(None))
    assert emit.frames is not None and len(emit.frames) == 3


def test_encodings_per_block_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer, "ENCODINGS_PER_BLOCK", 2)
    block = _block()
    item = LiveBlock.from_block(block)
    for n in range(5):
        sub = _sub("0x1", SEED, [f"k{n}"])
        assert _live(sub, item) == _old_frames(block, sub, "0x1")
    assert len(item.by_key) == 2


def test_a_filter_without_patterns_is_encoded_per_subscriber() -> None:
    def keep(key: str) -> bool:
        return key.startswith("acct/")

    assert share_key(keep) is UNSHARED
    item = LiveBlock.from_block(_block())
    one, two = item.emit(keep, UNSHARED), item.emit(keep, UNSHARED)
    assert one is not two and one.frames is None and one.results == two.results
    assert frames_for(one, "p", "s") == encode_frames(one, "p", "s")


def test_an_emit_of_ones_own_is_encoded_each_time() -> None:
    emit = Emit(1, "aa", "bb", ['{"n":1}'])
    first = frames_for(emit, "<", ">")
    assert first == (b'<{"n":1}>',) and emit.frames is None
    assert frames_for(emit, "<", ">") is not first


def test_live_frames_with_nothing_queued_go_to_the_direct_writer_as_aiohttps_frames() -> None:
    item = LiveBlock.from_block(_block())
    written: list[tuple[bytes, int]] = []

    def direct(wire: bytes, count: int) -> bool:
        written.append((wire, count))
        return True

    subs = []
    for _ in range(2):  # two connections, the same subscription id: the same bytes
        params = parse_subscribe(["streams", "0x0", H, []])
        subs.append(Subscription("0x1", params, Outbox(8, direct=direct)))
        subs[-1].put_nowait([item.emit(subs[-1].keep, share_key(subs[-1].keep))])
    expected = _old_frames(_block(), subs[0], "0x1")
    assert [c for _, c in written] == [len(expected)] * 2
    assert written[0][0] is written[1][0] and written[0][0] == frame_texts(expected)
    assert all(len(s._outbox) == 0 for s in subs)
