"""Canonical marking of a local lake without Spark: pyarrow rewrites, one delta-rs commit."""

from __future__ import annotations

from deltalake import DeltaTable

from pipeline.chain.produce.generator import SyntheticChain
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.storage import tables
from pipeline.lake.write.jobs import ensure_tables
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import append_blocks, settings_for


def test_a_local_lake_is_marked_without_spark_in_one_commit(redis_url: str, lake_uri: str) -> None:
    gen = SyntheticChain(seed=5)
    main = gen.take(8)
    branch = gen.reorg(3, 2)  # replaces heights 5..7 with a heavier branch
    settings = settings_for(redis_url, lake_uri)
    ensure_tables(settings.lake)  # the lake's own layout (blocks partitioned by stream)
    append_blocks(lake_uri, "c", [*main, *branch], canonical=False)
    table = LakeSettings.from_url(lake_uri).table(tables.BLOCKS)
    before = DeltaTable(table).version()
    marked = mark_canonical(None, settings, "c")  # no Spark session at all
    assert marked.head_hash == branch[-1].hash
    assert DeltaTable(table).version() == before + 1  # one commit
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    canonical = sorted((r["num"], r["hash"]) for r in rows if r["canonical"])
    assert canonical == sorted((b.num, b.hash.hex()) for b in gen.canonical)
    assert marked.marked == len(gen.canonical)
    # a second run finds the head canonical and commits nothing
    assert mark_canonical(None, settings, "c").marked == 0
    assert DeltaTable(table).version() == before + 1
