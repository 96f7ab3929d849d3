"""``sluice_archive`` end to end: Redis -> Airflow (dag.test) -> Spark jobs -> Delta -> trim.

A synthetic chain with reorgs and a plain stream are written with entry ids
inside one chosen data interval (plus a few entries after it). The DAG runs
for exactly that interval twice: first with a hot-retention window that
protects everything, then with a short one. Both runs must leave the same
tables; only the second trims, and only below the archived interval.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from pipeline import keys
from pipeline.chain.batch import ENTRY_FIELD, encode_block
from pipeline.chain.generator import SyntheticChain
from tests.integration.airflow.conftest import DagRunner, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

CHAIN = "chain:dagtest"
PLAIN = "events:dagtest"
# The run for logical date END archives [START, END) (CronDataIntervalTimetable, */5).
END = datetime(2026, 6, 1, 12, 5, tzinfo=UTC)
START = END - timedelta(minutes=5)
START_MS, END_MS = int(START.timestamp() * 1000), int(END.timestamp() * 1000)
AFTER = 3  # entries after the interval: not archived by this run, never trimmed by it


def write_entries(client: redis.Redis) -> dict[str, Any]:
    chain = SyntheticChain(seed=11, reorg_every=6, reorg_depth=2)
    inside = chain.take(30)
    canonical = list(chain.canonical)
    after = chain.take(AFTER)
    pipe = client.pipeline(transaction=False)
    ids = [f"{START_MS + 1000 * (i + 1)}-{i % 2}" for i in range(len(inside))]
    # The very first and last millisecond of the interval belong to it.
    ids[0], ids[-1] = f"{START_MS}-0", f"{END_MS - 1}-0"
    for block, entry_id in zip(inside, ids, strict=True):
        pipe.xadd(keys.stream(CHAIN), {ENTRY_FIELD: encode_block(block)}, id=entry_id)
    for i, block in enumerate(after[:AFTER]):
        pipe.xadd(keys.stream(CHAIN), {ENTRY_FIELD: encode_block(block)}, id=f"{END_MS + i}-0")
    for i in range(10):
        pipe.xadd(keys.stream(PLAIN), {b"n": str(i).encode()}, id=f"{START_MS + 7 * i}-0")
    for i in range(2):
        pipe.xadd(keys.stream(PLAIN), {b"n": b"late"}, id=f"{END_MS + 10 + i}-0")
    pipe.execute()
    return {"inside": inside, "canonical": canonical, "after": after[:AFTER]}


def table_rows(
    lake: str, name: str, drop: tuple[str, ...] = ("archived_at",)
) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    rows = DeltaTable(f"{lake}/{name}").to_pyarrow_table().to_pylist()
    for row in rows:
        for column in drop:
            row.pop(column, None)
        if isinstance(row.get("fields"), list):  # map<string, binary> comes back as pairs
            row["fields"] = sorted(row["fields"])
    return sorted(rows, key=repr)


@pytest.fixture(scope="module")
def archived(
    dag_runner: DagRunner,
    module_redis: redis.Redis,
    module_redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Any:
    lake = str(tmp_path_factory.mktemp("archive-dag") / "lake")
    written = write_entries(module_redis)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLUICE_REDIS_URL", module_redis_url)
        mp.setenv("SLUICE_LAKE_URI", lake)
        mp.setenv("SLUICE_STREAMS", f"{CHAIN},{PLAIN}")
        mp.setenv("SLUICE_CHAIN_STREAMS", CHAIN)
        # Run 1: a retention window far longer than the data's age: nothing may be trimmed.
        mp.setenv("SLUICE_HOT_RETENTION_S", str(10 * 365 * 86400))
        first = dag_runner.run("sluice_archive", END)
        lens_first = {s: module_redis.xlen(keys.stream(s)) for s in (CHAIN, PLAIN)}
        tables_first = {t: table_rows(lake, t) for t in ("blocks", "archive_log", "stream_entries")}
        # Run 2: the same interval again, now with a one-hour window.
        mp.setenv("SLUICE_HOT_RETENTION_S", "3600")
        second = dag_runner.run("sluice_archive", END)
        yield {
            "lake": lake,
            "written": written,
            "first": first,
            "second": second,
            "lens_first": lens_first,
            "tables_first": tables_first,
            "redis": module_redis,
        }


def test_both_runs_succeed_for_exactly_the_interval(archived: Any) -> None:
    for run in (archived["first"], archived["second"]):
        assert str(run.state) == "success", task_states(run)
        assert (run.data_interval_start, run.data_interval_end) == (START, END)
        states = task_states(run)
        assert states["archive[0]"] == states["archive[1]"] == "success"
        assert states["canonical[0]"] == "success" and "canonical[1]" not in states
        assert states["trim[0]"] == states["trim[1]"] == "success"
        assert states["publish[-1]"] == "success"


def test_blocks_are_archived_with_reorged_blocks_kept_non_canonical(archived: Any) -> None:
    from pipeline.lake.reader import LakeReader

    written = archived["written"]
    reader = LakeReader(archived["lake"])
    rows = [r for batch in reader.iter_canonical(CHAIN, 0, None) for r in batch]
    assert [(r.num, r.hash) for r in rows] == [(b.num, b.hash) for b in written["canonical"]]
    assert [r.payload for r in rows] == [encode_block(b) for b in written["canonical"]]
    canonical = {b.hash for b in written["canonical"]}
    reorged = [b for b in written["inside"] if b.hash not in canonical]
    assert reorged, "the synthetic chain must contain a reorg"
    for block in reorged:
        row = reader.find_hash(CHAIN, block.hash)
        assert row is not None and row.canonical is False
    head = reader.head(CHAIN)
    assert head is not None and head.hash == written["canonical"][-1].hash
    # Blocks after the interval are not in the lake yet.
    assert all(
        reader.find_hash(CHAIN, b.hash) is None
        for b in written["after"]
        if b.hash not in {x.hash for x in written["inside"]}
    )


def test_archive_log_records_the_interval_per_stream(archived: Any) -> None:
    log = archived["tables_first"]["archive_log"]
    by_stream = {row["stream"]: row for row in log}
    assert set(by_stream) == {CHAIN, PLAIN} and len(log) == 2
    for stream, entries in ((CHAIN, 30), (PLAIN, 10)):
        row = by_stream[stream]
        assert (row["start_ms"], row["end_ms"], row["entries"]) == (START_MS, END_MS, entries)
    assert by_stream[CHAIN]["blocks"] == 30 and by_stream[CHAIN]["invalid"] == 0
    entries = archived["tables_first"]["stream_entries"]
    assert sorted(r["entry_ms"] for r in entries if r["stream"] == PLAIN) == [
        START_MS + 7 * i for i in range(10)
    ]


def test_second_run_leaves_the_same_tables(archived: Any) -> None:
    lake = archived["lake"]
    for name, before in archived["tables_first"].items():
        after = table_rows(lake, name, drop=("archived_at", "run_id"))
        before = [{k: v for k, v in r.items() if k != "run_id"} for r in before]
        assert after == before, name


def test_trim_only_below_the_archived_interval_and_outside_retention(archived: Any) -> None:
    client = archived["redis"]
    # Run 1: everything was inside the retention window: nothing trimmed.
    assert archived["lens_first"] == {CHAIN: 30 + AFTER, PLAIN: 12}
    # Run 2: the archived interval is gone from Redis; what follows it survives.
    left = client.xrange(keys.stream(CHAIN))
    assert [entry_id.decode() for entry_id, _ in left] == [f"{END_MS + i}-0" for i in range(AFTER)]
    left_plain = client.xrange(keys.stream(PLAIN))
    assert [entry_id.decode() for entry_id, _ in left_plain] == [
        f"{END_MS + 10}-0",
        f"{END_MS + 11}-0",
    ]


def test_the_run_emits_the_lake_asset_with_its_interval(archived: Any) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.settings import Session
    from sqlalchemy import select

    with Session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == "sluice://lake/blocks")
        ).all()
        extras = [e.extra for e in events if e.source_run_id == archived["second"].run_id]
    assert extras and extras[-1]["start_ms"] == START_MS and extras[-1]["end_ms"] == END_MS
    assert sorted(extras[-1]["streams"]) == sorted([CHAIN, PLAIN])


def test_redis_down_fails_the_archive_and_trims_nothing(
    dag_runner: DagRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.localredis import free_port

    lake = tmp_path / "lake"
    monkeypatch.setenv("SLUICE_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setenv("SLUICE_LAKE_URI", str(lake))
    monkeypatch.setenv("SLUICE_STREAMS", CHAIN)
    monkeypatch.setenv("SLUICE_CHAIN_STREAMS", "")
    run = dag_runner.run("sluice_archive", END + timedelta(minutes=5))
    states = task_states(run)
    assert str(run.state) == "failed", states
    assert states["archive[0]"] == "failed"
    assert states["trim[0]"] == "upstream_failed" and states["publish[-1]"] == "upstream_failed"
    assert not (lake / "archive_log").exists() or table_rows(str(lake), "archive_log") == []
