"""The demo's terminal view: the lake's coverage line says what its numbers are."""

from __future__ import annotations

from pipeline.demo.view import _archived


def test_one_contiguous_stretch_is_said_so() -> None:
    cov = {"intervals": 3, "blocks": 120, "runs": [[0, 10]], "run_count": 1, "gap_count": 0}
    line = _archived(cov)
    assert line.startswith("120 blocks in 3 intervals, ")
    assert line.endswith("(1 contiguous stretch, 0 gaps)")
    assert " run" not in line


def test_stretches_are_counted_past_the_listed_ones() -> None:
    """The coverage lists the latest stretches only; ``run_count`` is all of them."""
    cov = {"intervals": 1, "blocks": 5, "runs": [[0, 1], [2, 3]], "run_count": 7, "gap_count": 1}
    assert _archived(cov).endswith("1 interval, - .. - (7 contiguous stretches, 1 gap)")


def test_nothing_archived_yet() -> None:
    assert _archived({}) == "nothing yet: sluice_archive runs every minute"
