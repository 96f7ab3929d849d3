"""Which new blocks of a batch stay out of ``blocks``: a height not the parent's plus one."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pipeline.lake.write.heights import NAMED, Aside, Heights, _spans, set_aside
from pipeline.settings import LakeSettings


def _rows(*blocks: tuple[int, str, str]) -> pa.Table:
    """Rows of ``(num, hash, parent)``, entry ids ``e<num>-<hash>``."""
    return pa.table(
        {
            "entry_id": [f"e{n}-{h}" for n, h, _ in blocks],
            "num": pa.array([n for n, _, _ in blocks], pa.int64()),
            "hash": [h for _, h, _ in blocks],
            "parent": [p for _, _, p in blocks],
        }
    )


def _chain(start: int, stop: int, branch: str, parent: str) -> list[tuple[int, str, str]]:
    out, prev = [], parent
    for n in range(start, stop):
        out.append((n, f"{branch}{n}", prev))
        prev = f"{branch}{n}"
    return out


def test_an_honest_batch_sets_nothing_aside(tmp_path: Path) -> None:
    lake = LakeSettings.from_url(str(tmp_path / "lake"))  # no table yet: parents unknown
    rows = _rows(*_chain(0, 10, "m", "g"), *_chain(5, 8, "f", "m4"))
    aside = set_aside(lake, "c", rows)
    assert len(aside.entry_ids) == 0 and aside.bad == ()


def test_a_lying_height_and_the_blocks_above_it_are_set_aside(tmp_path: Path) -> None:
    lake = LakeSettings.from_url(str(tmp_path / "lake"))
    liar = _chain(1911, 1914, "x", "m5")  # x1911's parent m5 is at 5
    rows = _rows(*liar[::-1], *_chain(0, 10, "m", "g"))  # any order
    aside = set_aside(lake, "c", rows)
    assert aside.bad == (("x1911", 1911, 5),)
    assert sorted(aside.entry_ids.to_pylist()) == ["e1911-x1911", "e1912-x1912", "e1913-x1913"]


def test_a_parent_given_as_context_is_found_but_not_judged(tmp_path: Path) -> None:
    lake = LakeSettings.from_url(str(tmp_path / "lake"))
    context = pa.table({"hash": ["m5"], "num": pa.array([5], pa.int64())})
    aside = set_aside(lake, "c", _rows((7, "y7", "m5")), context)
    assert aside.bad == (("y7", 7, 5),) and aside.entry_ids.to_pylist() == ["e7-y7"]


def test_a_runs_heights_sum_and_name_the_first_few() -> None:
    heights = Heights()
    many = tuple((f"h{i}", i + 10, i) for i in range(NAMED + 2))
    heights.add(Aside(pa.array(["a", "b"]), many[:1]))
    heights.add(Aside(pa.array([f"x{i}" for i in range(9)]), many))
    assert (heights.bad, heights.aside) == (NAMED + 3, 11)
    assert heights.named == [many[0], *many[: NAMED - 1]]


def test_wanted_heights_are_read_in_spans_of_files() -> None:
    assert _spans([]) == []
    assert _spans([3, 4, 9, 5000, 5001, 10**9]) == [(3, 9), (5000, 5001), (10**9, 10**9)]
