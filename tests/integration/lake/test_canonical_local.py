"""Canonical marking of a local lake without Spark: pyarrow rewrites, one delta-rs commit."""

from __future__ import annotations

from deltalake import DeltaTable

from pipeline.chain.batch import Block, encode_block
from pipeline.chain.generator import SyntheticChain
from pipeline.lake import tables
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.jobs import ensure_tables
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import settings_for


def _append(lake: LakeSettings, blocks: list[Block]) -> None:
    """``blocks`` as unmarked rows of the lake's ``blocks`` table (its own schema), with delta-rs."""
    import pyarrow as pa
    from deltalake import write_deltalake

    table = DeltaTable(lake.table(tables.BLOCKS))
    schema = pa.schema(table.schema().to_arrow())
    values = {
        "stream": ["c"] * len(blocks),
        "num": [b.num for b in blocks],
        "hash": [b.hash.hex() for b in blocks],
        "parent": [b.parent.hex() for b in blocks],
        "canonical": [False] * len(blocks),
        "entry_id": [f"{b.num + 1}-0" for b in blocks],
        "entry_ms": [b.num + 1 for b in blocks],
        "payload": [encode_block(b) for b in blocks],
        "weight": [b.weight.to_bytes(32, "big") if b.weight else None for b in blocks],
    }
    rows = pa.table({f.name: pa.array(values.get(f.name), f.type) if f.name in values
                     else pa.nulls(len(blocks), f.type) for f in schema}, schema=schema)  # fmt: skip
    write_deltalake(lake.table(tables.BLOCKS), rows, mode="append")


def test_a_local_lake_is_marked_without_spark_in_one_commit(redis_url: str, lake_uri: str) -> None:
    gen = SyntheticChain(seed=5)
    main = gen.take(8)
    branch = gen.reorg(3, 2)  # replaces heights 5..7 with a heavier branch
    settings = settings_for(redis_url, lake_uri)
    ensure_tables(settings.lake)  # the lake's own layout (blocks partitioned by stream)
    _append(settings.lake, [*main, *branch])
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
