"""``sluice_audit``, ``sluice_replay`` and ``sluice_maintenance`` on the archived lake.

They run with ``dag.test`` against the lake the session's ``sluice_archive``
runs built (conftest.py ``archived``); the audit also runs against a copy
whose canonical chain was corrupted with delta-rs.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, decode_block
from tests.integration.airflow import scenario as sc
from tests.integration.airflow.conftest import AIRFLOW_WARNINGS, DagRunner, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark, AIRFLOW_WARNINGS]


@pytest.fixture
def lake(archived: Any) -> Any:
    assert archived["second_ok"], archived["second"][0]
    return archived


def test_audit_passes_on_a_consistent_lake(dag_runner: DagRunner, lake: Any) -> None:
    run = dag_runner.run("sluice_audit", env=lake["env"])
    assert str(run.state) == "success", task_states(run)
    assert task_states(run) == {"chain_streams[-1]": "success", "audit[0]": "success"}


def test_audit_fails_on_a_broken_canonical_link(
    dag_runner: DagRunner, lake: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    broken = tmp_path / "lake"
    shutil.copytree(lake["lake"], broken)
    # Swap the canonical flag at one height: the reorged block there becomes
    # canonical, so the canonical block above it no longer links to it.
    canonical = {b.hash.hex() for b in lake["written"]["canonical"]}
    rows = DeltaTable(str(broken / "blocks")).to_pyarrow_table().to_pylist()
    head = max(r["num"] for r in rows if r["stream"] == sc.CHAIN)
    loser = next(r for r in rows if r["hash"] not in canonical and r["num"] < head)
    DeltaTable(str(broken / "blocks")).update(
        updates={"canonical": f"hash = '{loser['hash']}'"},
        predicate=f"stream = '{sc.CHAIN}' AND num = {loser['num']}",
    )
    run = dag_runner.run("sluice_audit", env={**lake["env"], "SLUICE_LAKE_URI": str(broken)})
    assert str(run.state) == "failed"
    assert task_states(run)["audit[0]"] == "failed"


def test_replay_republishes_a_block_range_into_a_target_stream(
    dag_runner: DagRunner, lake: Any, lake_redis: redis.Redis
) -> None:
    run = dag_runner.run(
        "sluice_replay", env=lake["env"], stream=sc.CHAIN, from_num=3, to_num=9,
        target="chain:replayed",
    )  # fmt: skip
    assert str(run.state) == "success", task_states(run)
    entries = lake_redis.xrange(keys.stream("chain:replayed"))
    blocks = [decode_block(fields[ENTRY_FIELD]) for _, fields in entries]
    expected = [b for b in lake["written"]["canonical"] if 3 <= b.num <= 9]
    assert [(b.num, b.hash) for b in blocks] == [(b.num, b.hash) for b in expected]


def test_replay_refuses_a_reversed_range(dag_runner: DagRunner, lake: Any) -> None:
    run = dag_runner.run(
        "sluice_replay", env=lake["env"], stream=sc.CHAIN, from_num=9, to_num=3, target="x"
    )
    assert str(run.state) == "failed"
    assert task_states(run)["replay[-1]"] == "failed"


def test_replay_refuses_a_negative_block_number(dag_runner: DagRunner, lake: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        dag_runner.run("sluice_replay", env=lake["env"], stream=sc.CHAIN, from_num=-1, to_num=3)


def test_maintenance_keeps_the_lake_readable(dag_runner: DagRunner, lake: Any) -> None:
    from pipeline.lake.storage.reader import LakeReader

    run = dag_runner.run("sluice_maintenance", datetime(2026, 6, 3, tzinfo=UTC), env=lake["env"])
    assert str(run.state) == "success", task_states(run)
    reader = LakeReader(lake["lake"])
    rows = [r for batch in reader.iter_canonical(sc.CHAIN, 0) for r in batch]
    assert [r.hash for r in rows] == [b.hash for b in lake["written"]["canonical"]]
