"""A stream whose entries contradict ``SLUICE_CHAIN_STREAMS``: archive, canonical and trim refuse
it in one line before anything is written or trimmed, and a job of several streams fails that
stream alone."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipeline import keys
from pipeline.errors import StreamKindError
from pipeline.lake.archive import archive_interval
from pipeline.lake.batch import archive_streams
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.intake.redisread import connect
from pipeline.lake.intake.streamset import sample
from pipeline.lake.storage import store, tables
from pipeline.lake.trim import safe_trim
from pipeline.lake.trimstreams import trim_streams
from pipeline.lake.write.jobs import ensure_tables
from tests.integration.lake.helpers import chain, publish, settings_for
from tests.support.lakejob import job_env, log_rows, run_job

UNDECLARED = "chain:s1"
PLAIN = "events:1"
NOW_MS = 10**13


def _plain(client: Any, stream: str, n: int, first_ms: int = 1000) -> None:
    for i in range(n):
        client.xadd(keys.stream(stream), {b"n": str(i).encode()}, id=f"{first_ms + i}-0")


def _logged(settings: Any, stream: str, start_ms: int, end_ms: int, entries: int) -> None:
    """An ``archive_log`` row saying ``[start_ms, end_ms)`` of ``stream`` is archived (so
    only the refusal can stop a trim)."""
    ensure_tables(settings.lake)
    row = {"stream": stream, "start_ms": start_ms, "end_ms": end_ms, "entries": entries,
           "blocks": 0, "invalid": 0, "first_id": None, "last_id": None, "run_id": "t",
           "archived_at": None}  # fmt: skip
    table = pa.Table.from_pylist([row], schema=tables.ARCHIVE_LOG_ARROW)
    write_deltalake(settings.lake.table(tables.ARCHIVE_LOG), table, mode="append")


def _entry_rows(settings: Any, stream: str) -> int:
    if not store.is_table(settings.lake, tables.STREAM_ENTRIES):
        return 0
    rows = store.open_table(settings.lake, tables.STREAM_ENTRIES).to_pyarrow_table(
        columns=["stream"]
    )
    return sum(1 for s in rows.column("stream").to_pylist() if s == stream)


@pytest.mark.parametrize(
    "job",
    [
        ["archive", "--start-ms", "1000", "--end-ms", "1040"],
        ["canonical"],
        ["trim", "--now-ms", str(NOW_MS)],
    ],
    ids=lambda job: job[0],
)
def test_blocks_in_a_stream_the_setting_does_not_name_are_refused_by_the_cli(
    job: list[str], redis_client: Any, redis_url: str, lake_uri: str, tmp_path: Path
) -> None:
    publish(redis_client, UNDECLARED, chain(0, 40))  # 1000..1039
    settings = settings_for(redis_url, lake_uri, streams=(UNDECLARED,), chain_streams=())
    _logged(settings, UNDECLARED, 0, 2000, 40)
    env = job_env(
        redis_url, lake_uri, tmp_path, SLUICE_STREAMS=UNDECLARED, SLUICE_CHAIN_STREAMS="chain:demo"
    )

    code, doc, err = run_job(env, job[0], "--stream", UNDECLARED, *job[1:], timeout=120)

    assert code == 1 and doc is None, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"sluice lake: stream {UNDECLARED!r}"), err
    assert "SLUICE_CHAIN_STREAMS (chain:demo)" in line, line
    assert redis_client.xlen(keys.stream(UNDECLARED)) == 40  # nothing trimmed
    assert _entry_rows(settings, UNDECLARED) == 0  # nothing archived
    assert log_rows(lake_uri, UNDECLARED) == [(0, 2000, 40)]


def test_a_declared_chain_stream_without_blocks_is_refused_before_any_write(
    redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    _plain(redis_client, PLAIN, 30)
    settings = settings_for(redis_url, lake_uri, streams=(PLAIN,), chain_streams=("events*",))
    _logged(settings, PLAIN, 0, 2000, 30)
    for run in (
        lambda: archive_interval(None, settings, PLAIN, 1000, 1040),  # no Spark: refused first
        lambda: mark_canonical(None, settings, PLAIN),
        lambda: safe_trim(settings, PLAIN, now_ms=NOW_MS),
    ):
        with pytest.raises(StreamKindError, match=r"events\*.*not blocks"):
            run()
    assert redis_client.xlen(keys.stream(PLAIN)) == 30
    assert _entry_rows(settings, PLAIN) == 0
    # one entry with a block among them: the declaration stands (its odd entries are raw)
    publish(redis_client, PLAIN, chain(0, 1), first_ms=5000)
    assert safe_trim(settings, PLAIN, now_ms=NOW_MS).trimmed == 30


def test_canonical_marking_refuses_a_stream_the_setting_does_not_name(
    redis_url: str, lake_uri: str
) -> None:
    settings = settings_for(redis_url, lake_uri, chain_streams=("chain:demo",))
    with pytest.raises(StreamKindError, match="'c' is not a chain stream by SLUICE_CHAIN_STREAMS"):
        mark_canonical(None, settings, "c")  # nothing in Redis: refused all the same


def test_a_stream_without_entries_has_nothing_to_check(
    redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    publish(redis_client, UNDECLARED, chain(0, 3))
    redis_client.xtrim(keys.stream(UNDECLARED), maxlen=0, approximate=False)
    client = connect(redis_url)
    try:
        assert sample(client, keys.stream(UNDECLARED)) == []
    finally:
        client.close()
    settings = settings_for(redis_url, lake_uri, streams=(UNDECLARED,), chain_streams=())
    done = archive_interval(None, settings, UNDECLARED, 1000, 1040)  # nothing to write: no Spark
    assert (done.entries, done.read) == (0, 0)


def test_a_job_of_several_streams_fails_the_mismatching_one_alone(
    redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    publish(redis_client, UNDECLARED, chain(0, 20))
    _plain(redis_client, "p", 10)
    settings = settings_for(redis_url, lake_uri, streams=(UNDECLARED, "p"), chain_streams=())
    for stream, entries in ((UNDECLARED, 20), ("p", 10)):
        _logged(settings, stream, 0, 2000, entries)

    def locked(stream: str) -> Any:
        return contextlib.nullcontext()

    trimmed, ok = trim_streams(
        settings, [UNDECLARED, "p"], now_ms=NOW_MS, locked=locked, check=lambda: None
    )
    assert not ok and trimmed["failed"] == [UNDECLARED]
    assert "SLUICE_CHAIN_STREAMS (empty)" in trimmed["streams"][UNDECLARED]["error"]
    assert trimmed["streams"]["p"]["trimmed"] == 10
    assert redis_client.xlen(keys.stream(UNDECLARED)) == 20

    # The archive of an interval Redis holds nothing of needs no Spark for the good stream.
    archived, ok = archive_streams(
        None, settings, [UNDECLARED, "p"], 3000, 4000, locked=locked, check=lambda: None
    )
    assert not ok and archived["failed"] == [UNDECLARED]
    assert "does not name it" in archived["streams"][UNDECLARED]["error"]
    assert archived["streams"]["p"]["entries"] == 0 and "error" not in archived["streams"]["p"]
    assert log_rows(lake_uri, "p")[-1][:2] == (3000, 4000)
