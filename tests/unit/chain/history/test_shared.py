"""Lake blocks encoded once and shared by concurrent catch-ups: same emits, bounded, counted."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.blockcodec import Block, encode_block
from pipeline.chain.cardinal import CARDINAL, encoding_for
from pipeline.chain.history.lakepages import page_emits
from pipeline.chain.history.shared import SharedResults, shape_of
from pipeline.chain.metrics import Metrics
from pipeline.chain.serve.patterns import compile_patterns


def _page(lo: int, hi: int, bad: int | None = None) -> pa.Table:
    blocks = [
        Block(
            num=n,
            hash=bytes([n & 255, n >> 8]) * 16,
            parent=bytes([(n - 1) & 255, (n - 1) >> 8 & 255]) * 16,
            updates={f"acct/{n}": n.to_bytes(4, "big")},
            weight=n * 3,
        )
        for n in range(lo, hi)
    ]
    payloads = [encode_block(b) for b in blocks]
    if bad is not None:
        payloads[bad - lo] = b"\xc1"  # not msgpack: skipped, never shared
    return pa.table(
        {
            "num": [b.num for b in blocks],
            "hash": [b.hash.hex() for b in blocks],
            "parent": [b.parent.hex() for b in blocks],
            "payload": payloads,
        }
    )


@pytest.mark.parametrize("dialect", ["seed", CARDINAL])
def test_a_second_reader_takes_the_first_ones_blocks_and_gets_the_same_emits(
    dialect: str,
) -> None:
    metrics = Metrics()
    shared = SharedResults(metrics=metrics)
    keep = encoding_for(None, dialect, False)
    shape = shape_of(keep)
    first = page_emits(_page(0, 50, bad=7), keep, shared, shape)
    # the second reader's page overlaps the first one's and goes further
    second = page_emits(_page(20, 80), keep, shared, shape)
    assert [e.num for e in first] == [n for n in range(50) if n != 7]
    assert second == page_emits(_page(20, 80), keep)  # as if encoded alone
    assert [e.num for e in second] == list(range(20, 80))
    assert (shared.hits, shared.misses) == (30, 50 + 30)
    assert metrics.values["sluice_serve_catchup_shared_hits_total"] == 30


def test_shapes_do_not_mix_and_an_unknown_filter_is_not_shared() -> None:
    shared = SharedResults()
    page = _page(0, 10)
    plain = page_emits(page, None, shared, shape_of(None))
    cardinal = encoding_for(None, CARDINAL, False)
    assert page_emits(page, cardinal, shared, shape_of(cardinal)) != plain
    assert shared.hits == 0
    filtered = compile_patterns(["acct/1"])
    assert shape_of(filtered) != shape_of(None)
    assert shape_of(lambda key: True) is None  # a filter that cannot be told apart


def test_bounded_by_blocks_and_by_characters() -> None:
    metrics = Metrics()
    shared = SharedResults(max_blocks=20, metrics=metrics)
    page_emits(_page(0, 50), None, shared, shape_of(None))
    assert len(shared) <= 20 and shared.clears == 2
    assert metrics.values["sluice_serve_catchup_shared_clears_total"] == 2
    small = SharedResults(max_chars=1000)
    page_emits(_page(0, 50), None, small, shape_of(None))
    assert sum(len(t) for texts, _w in small._blocks.values() for t in texts) <= 1000
    with pytest.raises(ValueError):
        SharedResults(max_blocks=0)


def test_a_reader_left_alone_reads_what_the_others_left_and_adds_nothing() -> None:
    shared = SharedResults()
    page_emits(_page(0, 50), None, shared, shape_of(None))  # put there by a reader now done
    alone = page_emits(_page(30, 90), None, shared, shape_of(None), fill=False)
    assert alone == page_emits(_page(30, 90), None)
    assert (shared.hits, shared.misses, len(shared)) == (20, 50 + 40, 50)
