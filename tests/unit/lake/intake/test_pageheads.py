"""page_heads (a page of block heads at once) agrees with HeadReader on every payload."""

from __future__ import annotations

import random

import msgpack
import pyarrow as pa

from pipeline.blockcodec import Block, encode_block
from pipeline.lake.intake.arrowpage import entries_to_batch, raw_to_batch
from pipeline.lake.intake.blockhead import HeadReader
from pipeline.lake.intake.pageheads import page_heads
from tests.unit.lake.intake.test_blockhead import HEADER_FAULTS, VALID

H, P = b"\x01" * 32, b"\x02" * 32
TAIL = b"\xa7deletes\x90\xa7batches\x80\xaasubbatches\x90"


def _common() -> list[bytes]:
    """Blocks in the layout page_heads reads: every num and weight width."""
    out = []
    for num in (0, 127, 128, 255, 256, 2**16, 2**32 + 5, 2**63 - 1):
        for weight in (None, 0, 1, 2**70, 2**256 - 1):
            updates = {f"k{i}": bytes([i]) * (num % 50) for i in range(num % 4)}
            out.append(
                encode_block(Block(num=num, hash=H, parent=P, updates=updates, weight=weight))
            )
    return out


def _tricky() -> list[bytes]:
    """Payloads that look like the common layout and are not, or not quite."""
    good = encode_block(Block(num=5, hash=H, parent=P, updates={"a": b"x"}))
    # updates ends early; the next key is "deletes" with a map holding the layout's last bytes
    start = good.index(b"\xa7updates") + 8
    fooled = good[:start] + b"\x80" + b"\xa7deletes\x81" + TAIL
    return [
        fooled,
        good[:-1],
        good + b"\x00",
        good.replace(b"\x87", b"\x88", 1),
        good[:-1] + b"\x91",  # subbatches not empty
        msgpack.packb({"num": 5, "hash": H, "parent": P, "updates": {}, "deletes": [],
                       "batches": {}, "subbatches": [], "num2": 1}, use_bin_type=True),
        msgpack.packb({"num": 5, "hash": H, "parent": P, "updates": {}, "deletes": [],
                       "batches": {}, "subbatches": [], "weight": None}, use_bin_type=True),
        good.replace(b"\xa3num\x05", b"\xa3num\xd0\x05"),  # int8 num
        good.replace(b"\xa3num\x05", b"\xa3num\xff"),  # negative fixint
    ]  # fmt: skip


def _mutations(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    base = _common()
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        out.append(bytes(data))
    return out


def _reference(data: bytes | None) -> object:
    if data is None:
        return None
    try:
        return HeadReader().head(data)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)


def test_page_heads_is_exactly_head_reader_where_it_answers() -> None:
    payloads: list[bytes | None] = [
        *_common(), *[encode_block(b) for b in VALID], *HEADER_FAULTS, *_tricky(),
        *_mutations(7, 2000), None, b"",
    ]  # fmt: skip
    found = page_heads(pa.array(payloads, pa.binary()))
    assert found.ok[: len(_common())].all()  # the common layout is read at once
    assert not found.ok[-2:].any()
    for i, data in enumerate(payloads):
        if not found.ok[i]:
            continue
        weight = found.weight[i].tobytes() if found.has_weight[i] else None
        got = (int(found.num[i]), found.hash[i].tobytes(), found.parent[i].tobytes(), weight)
        assert got == _reference(data), (i, data)
    tricky = found.ok[len(payloads) - 2 - 2000 - len(_tricky()) : len(payloads) - 2 - 2000]
    assert not tricky.any()


def test_raw_to_batch_equals_the_one_by_one_decode() -> None:
    payloads = [*_common(), *HEADER_FAULTS, *_tricky(), *_mutations(11, 500)]
    entries = [(f"{i}-0".encode(), {b"block": p}) for i, p in enumerate(payloads)]
    entries.append((b"9999-0", {b"x": b"1", b"block": payloads[0]}))
    entries.append((b"9999-1", {b"x": b"1"}))
    page = [[i, [x for pair in f.items() for x in pair]] for i, f in entries]
    for split in (False, True):
        batch = raw_to_batch(page, True, split=split).to_pylist()
        assert batch == entries_to_batch(entries, True, split=split).to_pylist()  # same reader
        for row, (_, fields) in zip(batch, entries, strict=True):
            head = _reference(fields.get(b"block"))
            if isinstance(head, tuple) and isinstance(head[0], int):
                num, block_hash, parent, weight = head
                assert row["valid_block"] and row["block_error"] is None
                assert (row["block_num"], row["block_hash"], row["block_parent"]) == (
                    num, block_hash.hex(), parent.hex()
                )  # fmt: skip
                assert (row["weight"], row["payload"]) == (weight, fields[b"block"])
                assert row["fields"] == ([] if split and len(fields) == 1 else list(
                    (k.decode(), v) for k, v in fields.items()
                ))  # fmt: skip
            else:
                assert row["valid_block"] is False and row["payload"] is None
                assert row["block_error"] == (
                    head[1][:500] if head else "entry has no 'block' field"
                )
