"""Which streams carry blocks: the declaration's glob rule and the refusals of a contradiction."""

from __future__ import annotations

from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block
from pipeline.blockcodec.streamkind import (
    Look,
    is_pattern,
    look,
    matches,
    mismatch,
    not_chain,
)

BLOCK = encode_block(Block(num=1, hash=b"h" * 32, parent=b"p" * 32))


def test_names_and_patterns_declare_streams() -> None:
    assert is_pattern("chain:*") and is_pattern("c?") and is_pattern("[ab]") and not is_pattern("c")
    assert matches(("chain:*",), "chain:s1") and matches(("c",), "c")
    assert not matches(("chain:demo",), "chain:s1") and not matches((), "c")


def test_an_entry_looks_like_a_block_only_when_its_block_field_decodes() -> None:
    assert look({ENTRY_FIELD: BLOCK}) is Look.BLOCK
    assert look({"block": BLOCK}) is Look.BLOCK  # a client that decodes names
    assert look({ENTRY_FIELD: b"\xc1 not msgpack"}) is Look.BROKEN
    assert look({ENTRY_FIELD: b""}) is Look.BROKEN
    assert look({b"n": b"1"}) is Look.PLAIN and look({}) is Look.PLAIN


def test_blocks_in_an_undeclared_stream_are_refused_naming_the_setting() -> None:
    text = mismatch(("chain:demo",), "chain:s1", [Look.BLOCK, Look.BLOCK])
    assert text is not None and "\n" not in text
    assert "'chain:s1'" in text and "SLUICE_CHAIN_STREAMS (chain:demo)" in text
    assert "first and last entries" in text
    assert "one entry" in (mismatch((), "s", [Look.BLOCK]) or "")
    # one plain or broken entry among them: the declaration stands
    assert mismatch(("chain:demo",), "chain:s1", [Look.BLOCK, Look.PLAIN]) is None
    assert mismatch(("chain:demo",), "chain:s1", [Look.BROKEN, Look.BLOCK]) is None


def test_a_declared_stream_without_a_block_field_is_refused() -> None:
    text = mismatch(("events*",), "events:1", [Look.PLAIN, Look.PLAIN])
    assert text is not None and "\n" not in text
    assert "'events:1'" in text and "SLUICE_CHAIN_STREAMS (events*)" in text
    # a chain stream's broken entries are still its own (archived raw)
    assert mismatch(("events*",), "events:1", [Look.BROKEN, Look.BROKEN]) is None
    assert mismatch(("events*",), "events:1", [Look.PLAIN, Look.BLOCK]) is None


def test_no_entry_nothing_to_check() -> None:
    assert mismatch(("c",), "c", []) is None and mismatch((), "d", []) is None


def test_a_chain_only_command_refuses_an_undeclared_stream() -> None:
    assert not_chain(("chain:*",), "chain:x", "why") is None
    text = not_chain((), "chain:x", "marking is for chain streams")
    assert text == (
        "stream 'chain:x' is not a chain stream by SLUICE_CHAIN_STREAMS (empty): "
        "marking is for chain streams"
    )
