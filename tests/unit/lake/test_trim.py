from __future__ import annotations

from pipeline.intervals import covered_until, merge_intervals


def test_merge_intervals() -> None:
    assert merge_intervals([(5, 10), (0, 5), (20, 30), (25, 26), (7, 7)]) == [(0, 10), (20, 30)]
    assert merge_intervals([]) == []


def test_coverage_stops_at_a_gap_and_needs_the_oldest_entry() -> None:
    log = [(0, 100), (100, 200), (250, 300)]
    assert covered_until(log, 0) == 200
    assert covered_until(log, 150) == 200
    assert covered_until(log, 200) is None  # the oldest entry sits in the gap
    assert covered_until(log, 260) == 300
    assert covered_until([], 5) is None
