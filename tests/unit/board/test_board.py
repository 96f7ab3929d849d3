"""The coverage board end to end, without Airflow: a local lake, a real redis-server, a plain host."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

import pytest
import redis

from pipeline import keys
from pipeline.board import source
from pipeline.board.board import LAKE_TTL_S, SNAPSHOT_TTL_S, CoverageBoard, Host
from pipeline.board.runs import RunInfo
from pipeline.errors import ConfigError
from pipeline.runtime import snapshot
from pipeline.settings import Settings
from tests.support.clock import HandClock
from tests.unit.board.conftest import MINUTE, write_archive_log

RUN = "manual__1"


def _host(url: str, runs: dict[str, RunInfo] | None = None, **changes: Any) -> Host:
    def read_runs(named: Iterable[str]) -> dict[str, RunInfo]:
        asked.append(set(named))
        return runs or {}

    asked: list[set[str]] = []
    fields: dict[str, Any] = {
        "read_runs": read_runs,
        "run_errors": (ConnectionError,),
        "ui_base": lambda: "/ui",
        "redis_url": lambda s: (url, "settings"),
    }
    return Host(**{**fields, **changes})


def _settings(lake_uri: str) -> Settings:
    return Settings.load(
        env={},
        lake_uri=lake_uri,
        streams="chain:a,events:*",
        chain_streams="chain:a",
        hot_retention_s=60,
    )


async def _body(board: CoverageBoard) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await board.body())
    return data


async def test_one_snapshot_reports_the_lake_redis_and_the_runs(
    lake_uri: str, redis_url: str, redis_client: redis.Redis
) -> None:
    write_archive_log(
        lake_uri,
        [
            {"stream": "chain:a", "start_ms": 0, "end_ms": MINUTE, "entries": 2, "run_id": RUN},
            {"stream": "events:x", "start_ms": 0, "end_ms": MINUTE, "entries": 1, "run_id": None},
        ],
    )
    redis_client.xadd(keys.stream("chain:a"), {"v": "1"}, id=f"{MINUTE // 2}-0")
    run = RunInfo(run_id=RUN, state="success", run_type="manual", start_ms=0, end_ms=MINUTE,
                  shards=(("events:x",), ("chain:a",)))  # fmt: skip
    board = CoverageBoard(_host(redis_url, {RUN: run}), lambda: _settings(lake_uri))
    try:
        data = await _body(board)
        again = await _body(board)  # within the snapshot window: the same snapshot
    finally:
        await board.close()
    assert again == data and board.builds == 1
    assert (data["dag_id"], data["ui_base"], data["dag_path"]) == (
        "sluice_archive", "/ui", "/dags/sluice_archive",
    )  # fmt: skip
    assert "error" not in data
    assert data["lake"]["error"] is None and data["lake"]["uri"] == lake_uri
    assert data["redis"]["up"] is True and data["airflow"]["error"] is None
    # The configured names (not the pattern) and the pattern's stream once archived, sorted.
    assert [s["name"] for s in data["streams"]] == ["chain:a", "events:x"]
    chain, events = data["streams"]
    assert (chain["chain"], chain["configured"], events["chain"], events["configured"]) == (
        True, True, False, True,
    )  # fmt: skip
    assert chain["redis"] == {"length": 1, "first_id": f"{MINUTE // 2}-0",
                              "last_id": f"{MINUTE // 2}-0"}  # fmt: skip
    assert chain["coverage"]["runs"] == [[0, MINUTE]]
    assert chain["coverage"]["trim_point_ms"] == MINUTE // 2
    [row] = chain["archive_runs"]
    assert row["state"] == "success"
    assert row["log_path"] == "/dags/sluice_archive/runs/manual__1/tasks/archive/mapped/1"
    assert events["redis"] == {"length": 0, "first_id": None, "last_id": None}
    assert events["archive_runs"][0]["run_path"] is None
    assert [r["run_id"] for r in data["dag_runs"]] == [RUN]
    assert data["stats"] == {"builds": 1, "lake_reads": 1, "airflow_reads": 1}


async def test_bad_settings_are_shown_not_raised(redis_url: str) -> None:
    board = CoverageBoard(
        _host(redis_url), lambda: Settings.load(env={"SLUICE_HOT_RETENTION_S": "-5"})
    )
    try:
        data = await _body(board)
    finally:
        await board.close()
    assert data["streams"] == []
    assert data["error"].startswith("sluice settings: setting 'hot_retention_s'"), data
    assert board.builds == 1 and board.lake_reads == 0


async def test_a_failing_source_is_reported_and_the_rest_served(lake_uri: str) -> None:
    def no_runs(named: Iterable[str]) -> dict[str, RunInfo]:
        raise ConnectionError("the metadata database is away")

    def no_redis(settings: Settings) -> tuple[str, str]:
        raise ConfigError("setting 'redis_url': not a Redis URL")

    board = CoverageBoard(
        _host("", read_runs=no_runs, redis_url=no_redis), lambda: _settings(lake_uri)
    )
    try:
        data = await _body(board)
    finally:
        await board.close()
    assert data["airflow"]["error"] == "airflow metadata: the metadata database is away"
    assert data["redis"] == {"up": False, "error": "redis: setting 'redis_url': not a Redis URL"}
    assert data["lake"]["error"] is None  # no archive_log yet: an empty lake, not an error
    assert [s["name"] for s in data["streams"]] == ["chain:a"]
    assert data["streams"][0]["redis"] is None and data["dag_runs"] == []


async def test_viewers_share_one_snapshot_and_one_lake_read_per_ttl(
    lake_uri: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_archive_log(
        lake_uri,
        [{"stream": "chain:a", "start_ms": 0, "end_ms": MINUTE, "entries": 2, "run_id": RUN}],
    )
    clock = HandClock()
    monkeypatch.setattr(snapshot, "time", clock)
    monkeypatch.setattr(source, "time", clock)
    board = CoverageBoard(_host(redis_url), lambda: _settings(lake_uri))
    try:
        await _body(board)  # the first look starts a read of every source
        async with asyncio.timeout(30):  # the lake's first read may outlast the first look
            while board.lake_reads == 0:  # noqa: ASYNC110 - the board has no event for it
                await asyncio.sleep(0.05)
        builds, reads = board.builds, board.lake_reads
        # 32 viewers at once, three times, while the clock stands still: nothing is rebuilt
        for _ in range(3):
            await asyncio.gather(*(_body(board) for _ in range(32)))
        assert (board.builds, board.lake_reads) == (builds, reads)
        # one snapshot TTL later: exactly one more build for all of them, the lake not read
        clock.now += SNAPSHOT_TTL_S
        await asyncio.gather(*(_body(board) for _ in range(32)))
        assert (board.builds, board.lake_reads) == (builds + 1, reads)
        # one lake TTL later: the lake is read once more, whoever asks
        clock.now += LAKE_TTL_S
        await asyncio.gather(*(_body(board) for _ in range(32)))
        assert board.lake_reads - reads <= 1
    finally:
        await board.close()


async def test_the_streams_are_listed_sorted_by_name(lake_uri: str, redis_url: str) -> None:
    """Configured and archived streams in one sorted list, whatever order the lake holds them in
    (issue 33, 7: a pattern's 100 streams came out in archive_log's order)."""
    rows = [
        {"stream": name, "start_ms": 0, "end_ms": MINUTE, "entries": 1, "run_id": None}
        for name in ("events:z", "events:b", "chain:a", "events:m", "alpha")
    ]
    write_archive_log(lake_uri, rows)
    board = CoverageBoard(
        _host(redis_url),
        lambda: Settings.load(
            env={}, lake_uri=lake_uri, streams="zz:last,chain:a,events:*", chain_streams="chain:a"
        ),
    )
    try:
        data = await _body(board)
    finally:
        await board.close()
    names = [s["name"] for s in data["streams"]]
    assert names == ["alpha", "chain:a", "events:b", "events:m", "events:z", "zz:last"], names
