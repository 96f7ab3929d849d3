"""The data of the DAG tests: a chain with reorgs and a plain stream, inside one interval.

Entry ids are placed inside the data interval ``[START, END)`` of the
``sluice_archive`` run for logical date ``END`` (``*/5`` cron), with a few
entries after it that this run must neither archive nor trim. One chain
entry inside the interval is not a block (``INVALID_ID``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block
from pipeline.chain.produce.generator import SyntheticChain

CHAIN = "chain:dagtest"
PLAIN = "events:dagtest"
END = datetime(2026, 6, 1, 12, 5, tzinfo=UTC)
START = END - timedelta(minutes=5)
START_MS, END_MS = int(START.timestamp() * 1000), int(END.timestamp() * 1000)
CHAIN_INSIDE = 30
PLAIN_INSIDE = 10
AFTER = 3  # chain entries after the interval
#: A chain entry inside the interval that is not a block: archived raw, a warning of the task.
INVALID_ID = f"{START_MS + 500}-0"
PLAIN_AFTER = 2


def write_entries(client: redis.Redis) -> dict[str, list[Block]]:
    """Write both streams; returns the blocks inside, the canonical chain as of END, and after."""
    chain = SyntheticChain(seed=11, reorg_every=6, reorg_depth=2)
    inside = chain.take(CHAIN_INSIDE)[:CHAIN_INSIDE]
    canonical = list(chain.canonical)
    after = chain.take(AFTER)[:AFTER]
    ids = [f"{START_MS + 1000 * (i + 1)}-{i % 2}" for i in range(len(inside))]
    # The very first and last millisecond of the interval belong to it.
    ids[0], ids[-1] = f"{START_MS}-0", f"{END_MS - 1}-0"
    pipe = client.pipeline(transaction=False)
    payloads = [
        (entry_id, encode_block(block)) for block, entry_id in zip(inside, ids, strict=True)
    ]
    payloads.append((INVALID_ID, b"not a block"))
    for entry_id, payload in sorted(payloads, key=lambda p: tuple(map(int, p[0].split("-")))):
        pipe.xadd(keys.stream(CHAIN), {ENTRY_FIELD: payload}, id=entry_id)
    for i, block in enumerate(after):
        pipe.xadd(keys.stream(CHAIN), {ENTRY_FIELD: encode_block(block)}, id=f"{END_MS + i}-0")
    for i in range(PLAIN_INSIDE):
        pipe.xadd(keys.stream(PLAIN), {b"n": str(i).encode()}, id=f"{START_MS + 7 * i}-0")
    for i in range(PLAIN_AFTER):
        pipe.xadd(keys.stream(PLAIN), {b"n": b"late"}, id=f"{END_MS + 10 + i}-0")
    pipe.execute()
    return {"inside": inside, "canonical": canonical, "after": after}


def table_rows(lake: str, name: str, drop: tuple[str, ...] = ("archived_at",)) -> list[Any]:
    """Every row of one lake table (delta-rs), without ``drop`` columns, in a stable order."""
    from deltalake import DeltaTable

    rows = DeltaTable(f"{lake}/{name}").to_pyarrow_table().to_pylist()
    for row in rows:
        for column in drop:
            row.pop(column, None)
        if isinstance(row.get("fields"), list):  # map<string, binary> comes back as pairs
            row["fields"] = sorted(row["fields"])
    return sorted(rows, key=repr)
