"""``sluice lake archive-streams``: one interval of several streams in one job and session.

Each job runs as a child (``python -m pipeline.lake.cli``), as Airflow runs it,
against the session's Spark Connect server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline import keys
from pipeline.lake.storage import tables
from pipeline.runtime.ports import free_port
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import chain, publish
from tests.support.lakejob import job_env, log_rows, run_job

pytestmark = [pytest.mark.spark]

W = 10_000  # interval width (ms)


def _env(redis_url: str, lake_uri: str, tmp_path: Path, remote: str) -> dict[str, str]:
    return job_env(
        redis_url, lake_uri, tmp_path, remote, SLUICE_STREAMS="c,p,bad", SLUICE_CHAIN_STREAMS="c"
    )


def _args(*streams: str, lo: int, hi: int, catchup: bool = False) -> list[str]:
    args = ["archive-streams", *(a for s in streams for a in ("--stream", s))]
    return [*args, "--start-ms", str(lo), "--end-ms", str(hi), "--run-id", "r"] + (
        ["--catchup"] if catchup else []
    )


def _lake_ids(lake_uri: str, stream: str) -> list[str]:
    uri = LakeSettings.from_url(lake_uri).table(tables.STREAM_ENTRIES)
    t = DeltaTable(uri).to_pyarrow_table(columns=["stream", "entry_id"])
    pairs = zip(t.column("stream").to_pylist(), t.column("entry_id").to_pylist(), strict=True)
    rows = [i for s, i in pairs if s == stream]
    return sorted(rows, key=lambda i: tuple(map(int, i.split("-"))))


def _plain(client: Any, stream: str, ms: list[int]) -> list[str]:
    ids = [f"{m}-0" for m in ms]
    for entry_id in ids:
        client.xadd(keys.stream(stream), {b"n": entry_id.encode()}, id=entry_id)
    return ids


def test_every_stream_in_one_job_and_a_failing_one_does_not_stop_the_others(
    spark_remote: str, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    chain_ids = publish(redis_client, "c", chain(0, 40), first_ms=1000)
    plain_ids = _plain(redis_client, "p", [1500, 2000, 9999])
    redis_client.set(keys.stream("bad"), b"not a stream")  # this stream's archive fails
    env = _env(redis_url, lake_uri, tmp_path, spark_remote)

    code, doc, err = run_job(env, *_args("c", "bad", "p", lo=0, hi=W))

    assert code == 1, err  # one stream failed: exit 1, and the result is still printed
    assert doc["failed"] == ["bad"]
    results = doc["streams"]
    assert list(results) == ["c", "bad", "p"]  # in the order given
    assert "bad" in results["bad"]["error"] and "not a stream" in results["bad"]["error"]
    assert results["c"]["entries"] == 40 and results["c"]["blocks"] == 40
    assert results["p"]["entries"] == 3 and results["p"]["read"] == 3
    assert results["c"]["warnings"] == 0 and results["bad"]["warnings"] >= 1
    assert doc["warnings"] >= 1
    # the lake holds exactly what Redis holds of the two good streams, each logged once
    assert _lake_ids(lake_uri, "c") == chain_ids and _lake_ids(lake_uri, "p") == plain_ids
    assert log_rows(lake_uri, "c") == [(0, W, 40)] and log_rows(lake_uri, "p") == [(0, W, 3)]
    assert log_rows(lake_uri, "bad") == []
    # the story: one line per stream's result, the failure at ERROR, the total
    assert "stream c: 40 entries read, 40 in the lake for the interval, 40 blocks" in err, err
    assert "stream p: 3 entries read, 3 in the lake for the interval" in err, err
    assert "ERROR stream bad: archive failed: " in err, err
    assert "2 of 3 stream(s) archived, 1 failed: bad; 43 entries read, 40 blocks" in err, err

    # Again: the good streams are archived already (nothing read); exit 0 without the bad one.
    code, again, err = run_job(env, *_args("c", "p", lo=0, hi=W))
    assert code == 0, err
    assert again["failed"] == []
    assert [again["streams"][s]["skipped"] for s in ("c", "p")] == [True, True]
    assert log_rows(lake_uri, "c") == [(0, W, 40)] and log_rows(lake_uri, "p") == [(0, W, 3)]


def test_catchup_fills_each_streams_holes_before_its_interval(
    spark_remote: str, redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    ids = _plain(redis_client, "p", [100, W + 100, 2 * W + 100, 3 * W + 100])
    other = _plain(redis_client, "c", [3 * W + 200])  # no row yet: nothing to catch up
    env = _env(redis_url, lake_uri, tmp_path, spark_remote) | {"SLUICE_CHAIN_STREAMS": ""}
    code, doc, err = run_job(env, *_args("p", lo=0, hi=W))  # p's first row: [0, W)
    assert code == 0, err

    code, doc, err = run_job(env, *_args("p", "c", lo=3 * W, hi=4 * W, catchup=True))

    assert code == 0, err
    p = doc["streams"]["p"]
    assert [(s["start_ms"], s["end_ms"], s["entries"]) for s in p["caught_up"]] == [
        (W, 2 * W, 1),
        (2 * W, 3 * W, 1),
    ]
    assert doc["streams"]["c"]["caught_up"] == []
    assert log_rows(lake_uri, "p") == [(k * W, (k + 1) * W, 1) for k in range(4)]
    assert _lake_ids(lake_uri, "p") == ids and _lake_ids(lake_uri, "c") == other
    assert "stream p: archiving 2 earlier interval(s) no run archived yet" in err, err
    # the summary counts what the catch-up read, not only the run's own interval
    assert "4 entries read (2 of them in 2 earlier interval(s) caught up)" in err, err


def test_a_lost_spark_server_fails_the_rest_without_trying_them(
    redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    _plain(redis_client, "p", [100])
    _plain(redis_client, "c", [200])
    url = f"sc://127.0.0.1:{free_port()}"  # nothing listens there
    env = _env(redis_url, lake_uri, tmp_path, url) | {"SLUICE_CHAIN_STREAMS": ""}
    env["SLUICE_ARCHIVE_JOB_WORKERS"] = "1"  # one worker: c starts after p failed

    code, doc, err = run_job(env, *_args("p", "c", lo=0, hi=W), timeout=120)

    assert code == 1, err
    assert doc["failed"] == ["p", "c"]
    first = doc["streams"]["p"]["error"]
    assert url.removeprefix("sc://") in first or url in first, first
    assert doc["streams"]["c"]["error"] == f"not tried: {first}"
    assert log_rows(lake_uri, "p") == [] and log_rows(lake_uri, "c") == []


def test_streams_left_near_the_time_limit_are_reported_not_started(
    redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    from contextlib import contextmanager

    from pipeline.lake.batch import archive_streams
    from tests.integration.lake.helpers import settings_for

    for name in ("p", "q", "r"):
        _plain(redis_client, name, [W + 1])  # nothing inside [0, W): no Spark needed
    # one worker: q and r would start after p's lock took the job past its limit
    settings = settings_for(redis_url, lake_uri, lake_job_timeout_s=1, archive_job_workers=1)
    waits = []

    @contextmanager
    def slow_lock(stream: str) -> Any:
        waits.append(stream)
        time.sleep(1.0)  # this stream's lock took the job past 90% of its 1 s limit
        yield

    result, ok = archive_streams(
        None, settings, ["p", "q", "r"], 0, W, locked=slow_lock, check=lambda: None
    )

    assert not ok and waits == ["p"]
    assert result["streams"]["p"]["entries"] == 0 and "error" not in result["streams"]["p"]
    assert result["failed"] == ["q", "r"]
    assert result["streams"]["q"]["error"].startswith("not tried: 90% of the job's 1s limit")
    assert log_rows(lake_uri, "p") == [(0, W, 0)] and log_rows(lake_uri, "q") == []


def test_a_stream_another_job_archived_after_the_snapshot_is_not_written_twice(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    """The job reads archive_log once, before any stream (pipeline.lake.logsnapshot). A
    job that held a stream's lock first (a backfill, a shard's own retry) and archived the
    same interval is not in that snapshot: the shared job then finds the lake's rows and
    takes the merge writer, which adds none of them again."""
    from contextlib import contextmanager

    from pipeline.lake.archive import archive_interval
    from pipeline.lake.batch import archive_streams
    from tests.integration.lake.helpers import settings_for

    ids = {name: _plain(redis_client, name, [5, 9, 200, W - 1]) for name in ("p", "q")}
    settings = settings_for(redis_url, lake_uri, streams=("p", "q"), chain_streams=())
    other: dict[str, Any] = {}

    @contextmanager
    def locked(stream: str) -> Any:
        if stream == "p":  # another job had p's lock first and archived the interval
            other["p"] = archive_interval(spark, settings, "p", 0, W)
        yield

    result, ok = archive_streams(
        spark, settings, ["p", "q"], 0, W, locked=locked, check=lambda: None
    )

    assert ok, result
    assert other["p"].entries == 4 and "merge_entries" not in other["p"].stages
    p = result["streams"]["p"]
    assert p["entries"] == 4, p
    assert "merge_entries" in p["stages"], p["stages"]  # found the rows: no second append
    for name in ("p", "q"):
        assert _lake_ids(lake_uri, name) == ids[name], name  # each entry once
        assert log_rows(lake_uri, name) == [(0, W, 4)], name
