"""``archive_log`` read with delta-rs: per stream the merged coverage and the newest rows."""

from __future__ import annotations

from pipeline.board.archivelog import ArchiveLogReader, LakeView, LoggedInterval, newest_rows
from tests.unit.board.conftest import MINUTE, write_archive_log


def test_no_table_yet_is_an_empty_view(lake_uri: str) -> None:
    assert ArchiveLogReader(lake_uri).read() == LakeView()


def test_rows_merge_into_runs_and_the_newest_come_first(lake_uri: str) -> None:
    write_archive_log(
        lake_uri,
        [
            {"stream": "s", "start_ms": 0, "end_ms": MINUTE, "entries": 3, "run_id": "r1"},
            {"stream": "s", "start_ms": MINUTE, "end_ms": 2 * MINUTE, "entries": 4, "run_id": "r2"},
            {"stream": "t", "start_ms": 0, "end_ms": MINUTE, "entries": 1, "run_id": None},
        ],
    )
    reader = ArchiveLogReader(lake_uri)
    view = reader.read()
    assert view.archived["s"].runs == ((0, 2 * MINUTE),)
    assert (view.archived["s"].intervals, view.archived["s"].entries) == (2, 7)
    assert [r.run_id for r in view.newest["s"]] == ["r2", "r1"]
    assert view.newest["t"][0].run_id is None
    assert view.newest["t"][0].archived_at_ms is not None
    # The handle is kept and brought up to date.
    write_archive_log(
        lake_uri,
        [
            {
                "stream": "s",
                "start_ms": 3 * MINUTE,
                "end_ms": 4 * MINUTE,
                "entries": 1,
                "run_id": "r3",
            }
        ],
    )
    again = reader.read()
    assert again.archived["s"].runs == ((0, 2 * MINUTE), (3 * MINUTE, 4 * MINUTE))
    assert [r.run_id for r in again.newest["s"]] == ["r3", "r2", "r1"]


def test_newest_rows_first_and_bounded() -> None:
    rows = [
        LoggedInterval(
            run_id=f"r{i}",
            start_ms=i * 10,
            end_ms=i * 10 + 10,
            entries=1,
            blocks=1,
            archived_at_ms=None,
        )  # fmt: skip
        for i in (3, 1, 4, 0, 2)
    ]
    assert [r.run_id for r in newest_rows(rows, limit=3)] == ["r4", "r3", "r2"]
