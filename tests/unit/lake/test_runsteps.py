"""What one archive run plans for a stream, read from a real Redis and a real ``archive_log``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
import redis

from pipeline import keys
from pipeline.errors import RedisUnavailable
from pipeline.lake.runsteps import run_steps
from pipeline.lake.storage.tables import ARCHIVE_LOG, ARCHIVE_LOG_ARROW
from pipeline.runtime.ports import free_port
from pipeline.settings import Settings

W = 300_000
S = 1_780_000_200_000
STREAM = "events:runsteps"


def _log(lake: Path, *intervals: tuple[int, int]) -> None:
    from deltalake import write_deltalake

    rows = [
        {"stream": STREAM, "start_ms": lo, "end_ms": hi, "entries": 0, "blocks": 0,
         "invalid": 0, "first_id": None, "last_id": None, "run_id": "t",
         "archived_at": datetime.now(UTC)}
        for lo, hi in intervals
    ]  # fmt: skip
    write_deltalake(
        str(lake / ARCHIVE_LOG), pa.Table.from_pylist(rows, schema=ARCHIVE_LOG_ARROW), mode="append"
    )


def test_a_new_stream_is_planned_from_its_first_entry_skipping_empty_time(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = Settings.load(env={}, redis_url=redis_url, lake_uri=str(tmp_path / "lake"))
    for ms in (S - 50 * W + 9, S - 50 * W + 10, S - 2 * W, S + 1):
        redis_client.xadd(keys.stream(STREAM), {b"n": b"1"}, id=f"{ms}-0")
    # no archive_log at all: from the first entry's interval, empty time as one step
    assert run_steps(settings, STREAM, S, S + W) == [
        (S - 50 * W, S - 49 * W),
        (S - 49 * W, S - 2 * W),
        (S - 2 * W, S - W),
        (S - W, S),
        (S, S + W),
    ]
    # a later run, with that logged: nothing before its own interval is left
    _log(tmp_path / "lake", (S - 50 * W, S + W))
    assert run_steps(settings, STREAM, S + W, S + 2 * W) == [(S + W, S + 2 * W)]


def test_no_stream_key_plans_the_interval_and_redis_away_is_one_error(
    redis_url: str, tmp_path: Path
) -> None:
    settings = Settings.load(env={}, redis_url=redis_url, lake_uri=str(tmp_path / "lake"))
    # the archive itself reports a missing stream: the plan is only its own interval
    assert run_steps(settings, "events:absent", S, S + W) == [(S, S + W)]
    away = settings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RedisUnavailable, match="unavailable"):
        run_steps(away, STREAM, S, S + W)
