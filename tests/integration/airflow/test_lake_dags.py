"""``sluice_audit``, ``sluice_replay`` and ``sluice_maintenance`` on an archived lake.

One ``sluice_archive`` run builds the lake for the module; each DAG then runs
with ``dag.test`` against it, and the audit also against a copy of the lake
whose canonical chain was corrupted with delta-rs.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from pipeline import keys
from pipeline.chain.batch import ENTRY_FIELD, decode_block, encode_block
from pipeline.chain.generator import SyntheticChain
from tests.integration.airflow.conftest import DagRunner, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

STREAM = "chain:lakedags"
END = datetime(2026, 6, 2, 8, 10, tzinfo=UTC)
START_MS = int((END - timedelta(minutes=5)).timestamp() * 1000)


@pytest.fixture(scope="module")
def lake(
    dag_runner: DagRunner,
    module_redis: redis.Redis,
    module_redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Any:
    chain = SyntheticChain(seed=23, reorg_every=5, reorg_depth=2)
    inside = chain.take(25)
    pipe = module_redis.pipeline(transaction=False)
    for i, block in enumerate(inside):
        pipe.xadd(keys.stream(STREAM), {ENTRY_FIELD: encode_block(block)}, id=f"{START_MS + i}-0")
    pipe.execute()
    root = str(tmp_path_factory.mktemp("lake-dags") / "lake")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLUICE_REDIS_URL", module_redis_url)
        mp.setenv("SLUICE_LAKE_URI", root)
        mp.setenv("SLUICE_STREAMS", STREAM)
        mp.setenv("SLUICE_CHAIN_STREAMS", STREAM)
        run = dag_runner.run("sluice_archive", END)
        assert str(run.state) == "success", task_states(run)
        yield {"root": root, "canonical": list(chain.canonical), "mp": mp}


def test_audit_passes_on_a_consistent_lake(dag_runner: DagRunner, lake: Any) -> None:
    run = dag_runner.run("sluice_audit")
    assert str(run.state) == "success", task_states(run)
    assert task_states(run)["audit[0]"] == "success"


def test_audit_fails_on_a_broken_canonical_link(
    dag_runner: DagRunner, lake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    broken = tmp_path / "lake"
    shutil.copytree(lake["root"], broken)
    # Promote a reorged block: its height now has a canonical block whose
    # successor's parent link points elsewhere.
    canonical = {b.hash.hex() for b in lake["canonical"]}
    table = DeltaTable(str(broken / "blocks"))
    rows = table.to_pyarrow_table(columns=["hash", "canonical"]).to_pylist()
    reorged = [r["hash"] for r in rows if r["hash"] not in canonical]
    assert reorged
    table.update(updates={"canonical": "true"}, predicate=f"hash = '{reorged[0]}'")
    # ...and demote the canonical block it replaced.
    victim = next(r for r in DeltaTable(str(broken / "blocks")).to_pyarrow_table().to_pylist()
                  if r["hash"] == reorged[0])  # fmt: skip
    DeltaTable(str(broken / "blocks")).update(
        updates={"canonical": "false"},
        predicate=f"num = {victim['num']} AND hash != '{reorged[0]}'",
    )
    monkeypatch.setenv("SLUICE_LAKE_URI", str(broken))
    run = dag_runner.run("sluice_audit")
    assert str(run.state) == "failed"
    assert task_states(run)["audit[0]"] == "failed"


def test_replay_republishes_a_block_range_into_a_target_stream(
    dag_runner: DagRunner, lake: Any, module_redis: redis.Redis
) -> None:
    run = dag_runner.run(
        "sluice_replay", stream=STREAM, from_num=3, to_num=9, target="chain:replayed"
    )
    assert str(run.state) == "success", task_states(run)
    entries = module_redis.xrange(keys.stream("chain:replayed"))
    blocks = [decode_block(fields[ENTRY_FIELD]) for _, fields in entries]
    expected = [b for b in lake["canonical"] if 3 <= b.num <= 9]
    assert [(b.num, b.hash) for b in blocks] == [(b.num, b.hash) for b in expected]


def test_replay_refuses_a_reversed_range(dag_runner: DagRunner, lake: Any) -> None:
    run = dag_runner.run("sluice_replay", stream=STREAM, from_num=9, to_num=3, target="x")
    assert str(run.state) == "failed"


def test_replay_refuses_a_negative_block_number(dag_runner: DagRunner, lake: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        dag_runner.run("sluice_replay", stream=STREAM, from_num=-1, to_num=3)


def test_maintenance_keeps_the_lake_readable(dag_runner: DagRunner, lake: Any) -> None:
    from pipeline.lake.reader import LakeReader

    run = dag_runner.run("sluice_maintenance", datetime(2026, 6, 3, tzinfo=UTC))
    assert str(run.state) == "success", task_states(run)
    rows = [r for batch in LakeReader(lake["root"]).iter_canonical(STREAM, 0) for r in batch]
    assert [r.hash for r in rows] == [b.hash for b in lake["canonical"]]
