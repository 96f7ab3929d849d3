from __future__ import annotations

from pipeline.lake.audit import Continuity


def _rows(nums: list[int], broken: set[int] = frozenset()) -> list[tuple[int, str, str]]:
    return [(n, f"h{n}", "bad" if n in broken else f"h{n - 1}") for n in nums]


def test_continuous_chain_is_ok() -> None:
    check = Continuity()
    check.feed(_rows([3, 4]))
    check.feed(_rows([5, 6]))  # across batches
    report = check.report("s")
    assert report.ok and (report.first, report.last, report.canonical_count) == (3, 6, 4)


def test_gaps_broken_links_and_duplicates() -> None:
    check = Continuity()
    check.feed(_rows([0, 1, 4, 5, 6, 9], broken={5}))
    check.feed([(9, "other", "h8")])
    report = check.report("s")
    assert not report.ok
    assert report.gaps == ((2, 3), (7, 8))
    assert report.broken_links == (5,)
    assert report.duplicates == (9,)


def test_empty() -> None:
    report = Continuity().report("s")
    assert report.ok and report.first is None and report.canonical_count == 0
