"""Block weight in the lake: the column (added to a pre-weight table), bad weights, heaviest chain."""

from __future__ import annotations

from typing import Any

import msgpack
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipeline import keys
from pipeline.blockcodec import encode_block
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.lake.archive import archive_interval
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.storage import tables
from pipeline.lake.storage.reader import LakeReader
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import publish, settings_for

pytestmark = pytest.mark.spark


def test_weight_column_heaviest_chain_and_bad_weights(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    settings = settings_for(redis_url, lake_uri)
    lake = LakeSettings.from_url(lake_uri)
    # A blocks table from before weights: no weight column yet.
    write_deltalake(
        lake.table(tables.BLOCKS),
        pa.table({f.name: pa.array([], f.type) for f in tables.BLOCKS_ARROW}, tables.BLOCKS_ARROW),
        partition_by=["stream"],
        configuration=dict(tables.TABLE_PROPERTIES),
    )
    gen = SyntheticChain(seed=11)
    main = gen.take(10)
    branch = gen.reorg(4, 2)  # heights 6, 7 replace 6..9: shorter, heavier
    publish(redis_client, "c", main + branch, first_ms=1000)  # 1000..1011
    bad = msgpack.unpackb(encode_block(main[0]), raw=False)
    bad["weight"] = b"\x01" * 33  # over 256 bits
    redis_client.xadd(keys.stream("c"), {b"block": msgpack.packb(bad)}, id="1012-0")

    result = archive_interval(spark, settings, "c", 1000, 1013)
    assert (result.blocks, result.invalid, result.invalid_ids) == (12, 1, ("1012-0",))
    entries = DeltaTable(lake.table(tables.STREAM_ENTRIES)).to_pyarrow_table().to_pylist()
    assert "weight" in next(e["block_error"] for e in entries if e["entry_id"] == "1012-0")

    table = DeltaTable(lake.table(tables.BLOCKS))
    assert table.protocol().reader_features is None  # still readable by delta-rs' pyarrow path
    rows = {r["hash"]: r for r in table.to_pyarrow_table().to_pylist()}
    for block in main + branch:
        assert rows[block.hash.hex()]["weight"] == block.weight.to_bytes(32, "big")  # type: ignore[union-attr]

    marked = mark_canonical(spark, settings, "c")
    assert (marked.head_num, marked.head_hash) == (7, branch[-1].hash)
    reader = LakeReader(lake_uri)
    assert [r.hash for page in reader.iter_canonical("c", 0) for r in page] == [
        b.hash for b in gen.canonical
    ]
    found = reader.find_hash("c", main[9].hash)
    assert found is not None and not found.canonical and found.weight == main[9].weight
    head = reader.canonical_at("c", 7)
    assert head is not None and head.weight == branch[-1].weight
