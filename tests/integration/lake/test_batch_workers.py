"""``archive_streams`` with several workers: a slow stream does not hold the others back.

No Spark here: every stream's interval is empty in Redis, so each archive is
settled with Redis and delta-rs alone (an ``archive_log`` row each). The slow
stream is the first one given; its archive lock is held until every other
stream's result has been reported (as a MERGE of one chain interval held ten
streams for minutes when the job archived one stream after another).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager, nullcontext
from typing import Any

from pipeline import keys
from pipeline.lake.batch import archive_streams
from tests.integration.lake.helpers import settings_for
from tests.support.lakejob import log_rows
from tests.support.poll import until_sync

W = 10_000  # interval width (ms)
#: Bounds a hang only: the other streams take well under a second each.
HOLD_S = 120.0


def test_a_slow_stream_does_not_hold_the_others_back(
    redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    slow, others = "slow", [f"p{i}" for i in range(6)]
    for name in (slow, *others):
        redis_client.xadd(keys.stream(name), {b"n": b"1"}, id=f"{W + 1}-0")  # after [0, W)
    settings = settings_for(
        redis_url, lake_uri, streams=(slow, *others), chain_streams=(), archive_job_workers=2
    )
    done: list[str] = []
    held = threading.Event()

    @contextmanager
    def locked(stream: str) -> Any:
        if stream == slow:
            held.set()
            # the slow stream's work: it lasts until every other stream was reported
            until_sync(lambda: set(others) <= set(done), "the other streams", within_s=HOLD_S)
        yield

    result, ok = archive_streams(
        None,
        settings,
        [slow, *others],
        0,
        W,
        locked=locked,
        check=lambda: None,
        report=lambda res, seconds: done.append(res["stream"]),
    )

    assert ok, result
    assert held.is_set()
    # every other stream was archived and reported while the slow one was still at work
    assert sorted(done[:-1]) == sorted(others) and done[-1] == slow
    # results keep the order the streams were given, each with its own archive result
    assert list(result["streams"]) == [slow, *others]
    assert all(result["streams"][s]["entries"] == 0 for s in (slow, *others))
    assert all(log_rows(lake_uri, s) == [(0, W, 0)] for s in (slow, *others))


def test_log_rows_committed_together_are_read_back_per_stream(
    redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    """Rows of several streams logged in one MERGE (one file, ``stream`` as string_view)
    are found again per stream: a rerun sees every interval as archived already."""
    import pyarrow.parquet as pq

    from pipeline.lake.storage import tables

    names = [f"q{i}" for i in range(8)]
    for name in names:
        redis_client.xadd(keys.stream(name), {b"n": b"1"}, id=f"{W + 1}-0")
    settings = settings_for(redis_url, lake_uri, streams=tuple(names), chain_streams=())
    entered = threading.Barrier(len(names))

    @contextmanager
    def together(stream: str) -> Any:
        entered.wait(HOLD_S)  # every stream at work at once: their log rows meet
        yield

    result, ok = archive_streams(None, settings, names, 0, W, locked=together, check=lambda: None)
    assert ok, result
    log_dir = settings.lake.table(tables.ARCHIVE_LOG)
    files = [f for f in os.listdir(log_dir) if f.endswith(".parquet")]
    assert max(pq.read_metadata(f"{log_dir}/{f}").num_rows for f in files) > 1

    again, ok = archive_streams(
        None, settings, names, 0, W, locked=lambda s: nullcontext(), check=lambda: None
    )
    assert ok, again
    assert all(again["streams"][name]["skipped"] for name in names)
