"""The shared job's one read of ``archive_log``: the same answers as reading the table each time."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import redis

from pipeline import keys
from pipeline.lake.archivelog import logged_entries
from pipeline.lake.logsnapshot import LogSnapshot
from pipeline.lake.runsteps import run_steps
from pipeline.lake.storage.tables import ARCHIVE_LOG, ARCHIVE_LOG_ARROW
from pipeline.lake.trim import logged_intervals
from pipeline.settings import Settings

W = 300_000
S = 1_780_000_200_000


def _log(lake: Path, *rows: tuple[str, int, int, int]) -> None:
    """One append per call, as one shared MERGE is: several streams' rows in one file."""
    from deltalake import write_deltalake

    table = pa.Table.from_pylist(
        [
            {"stream": name, "start_ms": lo, "end_ms": hi, "entries": n, "blocks": 0,
             "invalid": 0, "first_id": None, "last_id": None, "run_id": "t",
             "archived_at": datetime.now(UTC)}
            for name, lo, hi, n in rows
        ],
        schema=ARCHIVE_LOG_ARROW,
    )  # fmt: skip
    write_deltalake(str(lake / ARCHIVE_LOG), table, mode="append")


def test_answers_as_the_table_does_for_every_stream_and_keeps_the_jobs_rows(
    tmp_path: Path,
) -> None:
    lake = tmp_path / "lake"
    settings = Settings.load(env={}, lake_uri=str(lake))
    _log(lake, ("a", S - 3 * W, S - 2 * W, 5), ("b", S, S + W, 7), ("c", S - W, S, 1))
    _log(lake, ("a", S - W, S, 6), ("a", S, S + W, 9), ("b", S - 9 * W, S - 8 * W, 2))
    _log(lake, ("a", S - 2 * W, S - W, 4), ("other", S, S + W, 3))
    names = ["a", "b", "c", "new"]
    snap = LogSnapshot(settings.lake, names, S, S + W)
    assert snap.rows == 7  # "other" is not read
    for name in names:
        assert snap.intervals(name) == _merged(logged_intervals(settings.lake, name)), name
        assert snap.entries(name, S, S + W) == logged_entries(settings.lake, name, S, S + W)
    assert snap.intervals("a") == [(S - 3 * W, S + W)]  # contiguous rows are one run
    assert snap.intervals("b") == [(S - 9 * W, S - 8 * W), (S, S + W)]
    assert snap.entries("a", S, S + W) == 9 and snap.entries("new", S, S + W) is None
    # what the job logs is seen afterwards; a logged interval keeps its first count
    snap.add("new", S - W, S, 11)
    snap.add("new", S, S + W, 12)
    snap.add("a", S, S + W, 99)
    assert snap.intervals("new") == [(S - W, S + W)]
    assert snap.entries("new", S - W, S) == 11 and snap.entries("a", S, S + W) == 9


def _merged(rows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    from pipeline.intervals import merge_intervals

    return merge_intervals(rows)


def test_no_log_yet_is_empty(tmp_path: Path) -> None:
    settings = Settings.load(env={}, lake_uri=str(tmp_path / "lake"))
    snap = LogSnapshot(settings.lake, ["a"], S, S + W)
    assert (snap.rows, snap.intervals("a"), snap.entries("a", S, S + W)) == (0, [], None)


def test_run_steps_from_the_snapshot_plan_what_the_table_plans(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    settings = Settings.load(env={}, redis_url=redis_url, lake_uri=str(lake))
    for ms in (S - 50 * W + 9, S - 20 * W + 3, S - 2 * W, S + 1):
        redis_client.xadd(keys.stream("events:snap"), {b"n": b"1"}, id=f"{ms}-0")
    _log(lake, ("events:snap", S - 30 * W, S - 10 * W, 1), ("events:snap", S - 5 * W, S - W, 1))
    snap = LogSnapshot(settings.lake, ["events:snap"], S, S + W)
    direct = run_steps(settings, "events:snap", S, S + W)
    assert run_steps(settings, "events:snap", S, S + W, snap) == direct
    assert direct[0] == (S - 50 * W, S - 49 * W) and direct[-1] == (S, S + W)
