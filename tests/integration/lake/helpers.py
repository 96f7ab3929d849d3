"""Small builders for lake tests: chains of blocks and rows of the blocks table."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from pipeline.blockcodec import Block, encode_block

GENESIS_PARENT = b"\x00" * 32


def block_hash(num: int, branch: str = "main") -> bytes:
    return hashlib.sha256(f"{branch}:{num}".encode()).digest()


def chain(
    start: int, stop: int, *, branch: str = "main", parent: bytes | None = None, size: int = 16
) -> list[Block]:
    """Blocks ``start..stop-1`` linked by parent hashes; the first one's parent is ``parent``."""
    blocks = []
    prev = (
        parent
        if parent is not None
        else (GENESIS_PARENT if start == 0 else block_hash(start - 1, branch))
    )
    for num in range(start, stop):
        h = block_hash(num, branch)
        blocks.append(Block(num=num, hash=h, parent=prev, updates={"k": bytes([num % 256]) * size}))
        prev = h
    return blocks


def block_rows(stream: str, blocks: list[Block], *, canonical: bool = True) -> list[dict[str, Any]]:
    """Rows of the ``blocks`` table for ``blocks``, entry ids made up from the block number."""
    now = datetime.now(UTC)
    return [
        {
            "stream": stream,
            "num": b.num,
            "hash": b.hash.hex(),
            "parent": b.parent.hex(),
            "canonical": canonical,
            "entry_id": f"{1000 + b.num}-0",
            "entry_ms": 1000 + b.num,
            "payload": encode_block(b),
            "archived_at": now,
        }
        for b in blocks
    ]


def publish(client: Any, stream: str, blocks: list[Block], *, first_ms: int = 1000) -> list[str]:
    """XADD each block with id ``first_ms + i``-0 into the stream of ``stream``; returns the ids."""
    from pipeline import keys
    from pipeline.blockcodec import ENTRY_FIELD

    ids = []
    pipe = client.pipeline(transaction=False)
    for i, block in enumerate(blocks):
        entry_id = f"{first_ms + i}-0"
        pipe.xadd(keys.stream(stream), {ENTRY_FIELD: encode_block(block)}, id=entry_id)
        ids.append(entry_id)
    pipe.execute()
    return ids


def settings_for(redis_url: str, lake_uri: str, **extra: Any) -> Any:
    from pipeline.settings import Settings

    values: dict[str, Any] = {
        "redis_url": redis_url,
        "lake_uri": lake_uri,
        "streams": ("c", "plain"),
        "chain_streams": ("c",),
        "archive_partitions": 2,
        "archive_range_entries": 1,  # two ranges however small the interval
        "hot_retention_s": 0,
    }
    values.update(extra)
    return Settings.load(env={}, config_path="/nonexistent/sluice.toml", **values)


def append_blocks(
    lake_uri: str, stream: str, blocks: list[Block], *, canonical: bool = True
) -> None:
    """Append rows for ``blocks`` to the lake's ``blocks`` table with delta-rs (no Spark).

    Entry ids are made up from the block number: block ``n`` came from entry ``n+1-0``.
    An existing table is written with its own schema (a column not set here is null).
    """
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from pipeline.lake.storage import tables
    from pipeline.settings import LakeSettings

    values = {
        "stream": [stream] * len(blocks),
        "num": [b.num for b in blocks],
        "hash": [b.hash.hex() for b in blocks],
        "parent": [b.parent.hex() for b in blocks],
        "canonical": [canonical] * len(blocks),
        "entry_id": [f"{b.num + 1}-0" for b in blocks],
        "entry_ms": [b.num + 1 for b in blocks],
        "payload": [encode_block(b) for b in blocks],
        "weight": [b.weight.to_bytes(32, "big") if b.weight else None for b in blocks],
    }
    path = LakeSettings.from_url(lake_uri).table(tables.BLOCKS)
    schema = (
        pa.schema(DeltaTable(path).schema().to_arrow())
        if DeltaTable.is_deltatable(path)
        else tables.BLOCKS_ARROW
    )
    columns = {
        f.name: pa.array(values[f.name], f.type)
        if f.name in values
        else pa.nulls(len(blocks), f.type)
        for f in schema
    }
    write_deltalake(path, pa.table(columns, schema=schema), mode="append")
