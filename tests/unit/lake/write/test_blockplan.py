"""The archive's plan, payload columns and a writer task's first-seen filter (pure Arrow;
the rows against the Spark writer's: tests/integration/lake/test_mergewrite.py and
test_arrowwrite.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.intake import arrowpage as source
from pipeline.lake.write.blockplan import FirstSeen, plan, restore_blocks
from pipeline.lake.write.filerows import entry_rows


def _read(rows: list[tuple[str, bool, str | None, dict[str, bytes]]]) -> pa.Table:
    """``(entry_id, valid, hash, fields)`` rows; a valid one with no fields is split off."""
    return pa.Table.from_pylist(
        [
            {
                "entry_id": entry_id,
                "entry_ms": int(entry_id.split("-")[0]),
                "entry_seq": int(entry_id.split("-")[1]),
                "fields": list(fields.items()),
                "valid_block": valid,
                "block_num": 1 if valid else None,
                "block_hash": digest,
                "payload": f"p{entry_id}".encode() if valid else None,
            }
            for entry_id, valid, digest, fields in rows
        ],
        schema=source.ARROW_SCHEMA,
    )


def _owners(pairs: list[tuple[str, str]]) -> pa.Table:
    return pa.table(
        {"hash": [h for h, _ in pairs], "entry_id": [e for _, e in pairs]},
        schema=pa.schema([("hash", pa.string()), ("entry_id", pa.string())]),
    )


def test_first_entry_of_an_unknown_hash_is_new_others_present_or_dup() -> None:
    read = _read(
        [
            ("1-0", True, "a", {}),  # new
            ("2-0", True, "a", {}),  # dup in the read
            ("3-0", True, "b", {}),  # in blocks from this entry: present
            ("4-0", True, "b", {}),  # in blocks from 3-0: dup
            ("5-0", True, "c", {}),  # in blocks from another entry: dup
            ("6-0", False, None, {"x": b"1"}),  # not a block
            ("7-0", True, "d", {"block": b"q", "note": b"n"}),  # new, keeps its fields
        ]
    )
    new, dup = plan(read, _owners([("b", "3-0"), ("c", "9-0")]))
    assert new.to_pylist() == [True, False, False, False, False, False, True]
    assert dup.to_pylist() == [False, True, False, True, True, False, False]

    fields = restore_blocks(read, dup)
    restored = read.set_column(read.schema.get_field_index("fields"), "fields", fields)
    (batch,) = restored.to_batches()
    in_blocks = entry_rows(batch, pa.scalar(0, pa.timestamp("us", tz="UTC"))).column(
        "payload_in_blocks"
    )
    assert in_blocks.to_pylist() == [True, False, True, False, False, False, False]
    assert fields.to_pylist() == [
        [],
        [("block", b"p2-0")],
        [],
        [("block", b"p4-0")],
        [("block", b"p5-0")],
        [("x", b"1")],
        [("block", b"q"), ("note", b"n")],
    ]


def test_no_owners_and_distinct_hashes_make_every_valid_entry_new() -> None:
    read = _read(
        [("1-0", True, "a", {}), ("2-0", False, None, {"x": b"1"}), ("3-0", True, "b", {})]
    )
    new, dup = plan(read, _owners([]))
    assert new.to_pylist() == [True, False, True]
    assert dup.to_pylist() == [False, False, False]


def test_a_task_keeps_the_first_entry_of_each_hash_across_its_pages() -> None:
    seen = FirstSeen()
    page1 = _read(
        [("1-0", True, "a", {}), ("2-0", True, "a", {}), ("3-0", False, None, {"x": b"1"})]
    )
    page2 = _read([("4-0", True, "b", {}), ("5-0", True, "a", {}), ("6-0", True, "b", {})])
    firsts = []
    for page in (page1, page2):
        valid = pc.fill_null(page.column("valid_block"), False).to_numpy(zero_copy_only=False)
        hashes = page.column("block_hash").combine_chunks()
        firsts.append(seen.first(hashes, valid).tolist())
    assert firsts == [[True, False, False], [True, False, False]]
    assert FirstSeen().first(pa.array([], pa.string()), np.zeros(0, bool)).tolist() == []


def _exactly_first(pages: list[tuple[list[str | None], np.ndarray]]) -> list[list[bool]]:
    """The rule FirstSeen keeps within its window: a valid entry whose hash no earlier had."""
    seen: set[str] = set()
    out = []
    for hashes, valid in pages:
        keep = []
        for digest, ok in zip(hashes, valid.tolist(), strict=True):
            keep.append(bool(ok) and digest not in seen)
            if ok:
                seen.add(str(digest))
        out.append(keep)
    return out


def test_first_seen_is_exact_on_block_hashes_sharing_their_first_eight_bytes() -> None:
    """Random pages of 64-digit hashes (repeats, invalid entries, hashes that share their
    first 16 digits): within the window the vectorised check keeps what a set would."""
    rng = np.random.default_rng(7)
    pool = [rng.bytes(32).hex() for _ in range(300)]
    pool += [pool[i][:16] + rng.bytes(24).hex() for i in range(20)]  # same 8-byte key
    pages = []
    for size in rng.integers(0, 60, 40).tolist():
        valid = rng.random(size) < 0.9
        picks = rng.integers(0, len(pool), size).tolist()
        hashes = [pool[p] if ok else None for p, ok in zip(picks, valid.tolist(), strict=True)]
        pages.append((hashes, valid))
    pages.append(([pool[0], pool[0]], np.array([True, True])))
    seen = FirstSeen(window=10_000)
    got = [seen.first(pa.array(h, pa.string()), v).tolist() for h, v in pages]
    assert got == _exactly_first(pages)
    assert sum(map(sum, got)) > 100 and sum(map(len, got)) - sum(map(sum, got)) > 100


def test_a_repeat_further_back_than_the_window_is_written_as_a_first() -> None:
    """The driver's fix settles it (arrowfix: the task's hash keys are not distinct)."""
    h = [f"{i:064x}" for i in range(5)]
    seen = FirstSeen(window=4)
    ones = np.ones
    assert seen.first(pa.array(h[:1]), ones(1, bool)).tolist() == [True]
    assert seen.first(pa.array(h[1:]), ones(4, bool)).tolist() == [True] * 4
    # h[0] is 5 entries back, h[4] one: only the latter is settled here
    assert seen.first(pa.array([h[0], h[4]]), ones(2, bool)).tolist() == [True, False]
