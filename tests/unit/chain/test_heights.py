"""Heights that cannot lie (pipeline/chain/heights.py)."""

from __future__ import annotations

from pipeline.chain.heights import Heights


def test_a_block_one_above_its_parent_passes_and_a_lying_one_is_set_aside() -> None:
    h = Heights()
    assert h.check(0, "a0", "g") is None  # parent unknown: let through
    assert h.check(1, "a1", "a0") is None
    assert h.check(2, "a2", "a1") is None
    why = h.check(273, "x", "a2")  # the child of 2 claims 273
    assert why is not None and "block 273" in why and "not 272" in why
    assert h.refused == 1 and h.last_refusal == why
    # its descendants too, whatever their heights
    assert h.check(274, "y", "x") is not None
    assert h.check(3, "z", "x") is not None
    assert h.refused == 3 and h.last_refusal == why  # (the one that lied is named)
    # asked again (another reader): the same answer, not counted again
    assert h.check(273, "x", "a2") is not None and h.refused == 3
    # a block below its parent is refused as well
    assert h.check(1, "w", "a2") is not None
    # and the chain the bad block would extend goes on
    assert h.check(3, "a3", "a2") is None


def test_memory_is_bounded() -> None:
    h = Heights(remember=8)
    for n in range(100):
        assert h.check(n, f"a{n}", f"a{n - 1}") is None
        h.check(n + 5, f"bad{n}", f"a{n}")
    assert len(h._nums) <= 8 and len(h._bad) <= 8
