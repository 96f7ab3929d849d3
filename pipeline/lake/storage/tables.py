"""The Delta tables of the lake: names and schemas, with no Spark import.

Spark DDL strings are used by the jobs; the arrow schemas by the JVM-free
reader and by tests that write tables with delta-rs. Column order matters:
``num`` comes early in ``blocks`` so Delta collects min/max stats on it and
readers skip files by block number.
"""

from __future__ import annotations

import pyarrow as pa

STREAM_ENTRIES = "stream_entries"
BLOCKS = "blocks"
ARCHIVE_LOG = "archive_log"

#: Table properties every table keeps so delta-rs' pyarrow path can read it.
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
}

#: ``delta.dataSkippingStatsColumns`` per table: the columns readers prune files
#: by. Delta collects min/max of these only (not of every hash, id and payload
#: column): about a quarter less CPU per written row. Set by the archive on
#: tables that lack it (a metadata-only commit).
STATS_COLUMNS = {
    STREAM_ENTRIES: "entry_ms,entry_seq,block_num",
    BLOCKS: "num,entry_ms",
}

STREAM_ENTRIES_DDL = (
    "stream STRING NOT NULL, entry_id STRING NOT NULL, entry_ms BIGINT NOT NULL, "
    "entry_seq BIGINT NOT NULL, fields MAP<STRING, BINARY>, valid_block BOOLEAN, "
    "block_num BIGINT, block_hash STRING, block_parent STRING, block_error STRING, "
    "archived_at TIMESTAMP, payload_in_blocks BOOLEAN"
)
"""``valid_block`` is null for non-chain streams; ``block_*`` describe the decoded
block of a chain entry (``block_error`` says why one is not a valid block).
See :data:`PAYLOAD_COLUMN` for ``payload_in_blocks``."""

#: ``stream_entries.payload_in_blocks``: True when the entry's ``block`` field is
#: not in ``fields`` because ``blocks`` holds it, byte for byte, as the ``payload``
#: of the row with this entry's ``(stream, block_num, block_hash)`` and
#: ``entry_id`` (each payload is stored once). False or null: ``fields`` is the
#: whole entry (null for rows written before the column existed, and for
#: non-chain streams). :func:`pipeline.lake.storage.entries.read_entries` puts entries
#: back together. Nullable and last, so older tables gain it by a plain column add.
PAYLOAD_COLUMN = "payload_in_blocks"

BLOCKS_DDL = (
    "stream STRING NOT NULL, num BIGINT NOT NULL, hash STRING NOT NULL, "
    "parent STRING NOT NULL, canonical BOOLEAN NOT NULL, entry_id STRING NOT NULL, "
    "entry_ms BIGINT NOT NULL, payload BINARY NOT NULL, archived_at TIMESTAMP"
)
"""The columns every writer of ``blocks`` fills. The table also has :data:`WEIGHT_COLUMN`."""

#: ``blocks.weight``: the block's weight as 32 bytes big-endian (byte order is
#: numeric order), null for blocks written before weights existed, which count as
#: ``num + 1`` (:func:`pipeline.blockcodec.effective_weight`). Nullable and last,
#: so tables created before it gain it by a plain column add (no rewrite, no
#: column mapping) and writers that do not know it leave it null.
WEIGHT_COLUMN = "weight"
WEIGHT_DDL = "weight BINARY"

ARCHIVE_LOG_DDL = (
    "stream STRING NOT NULL, start_ms BIGINT NOT NULL, end_ms BIGINT NOT NULL, "
    "entries BIGINT NOT NULL, blocks BIGINT NOT NULL, invalid BIGINT NOT NULL, "
    "first_id STRING, last_id STRING, run_id STRING, archived_at TIMESTAMP"
)

#: ``hash`` and ``parent`` are lower-case hex without ``0x``; ``payload`` is
#: :func:`pipeline.blockcodec.encode_block` bytes.
BLOCKS_ARROW = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("num", pa.int64(), nullable=False),
        pa.field("hash", pa.string(), nullable=False),
        pa.field("parent", pa.string(), nullable=False),
        pa.field("canonical", pa.bool_(), nullable=False),
        pa.field("entry_id", pa.string(), nullable=False),
        pa.field("entry_ms", pa.int64(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("archived_at", pa.timestamp("us", tz="UTC")),
    ]
)


STREAM_ENTRIES_ARROW = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("entry_id", pa.string(), nullable=False),
        pa.field("entry_ms", pa.int64(), nullable=False),
        pa.field("entry_seq", pa.int64(), nullable=False),
        pa.field("fields", pa.map_(pa.string(), pa.binary())),
        pa.field("valid_block", pa.bool_()),
        pa.field("block_num", pa.int64()),
        pa.field("block_hash", pa.string()),
        pa.field("block_parent", pa.string()),
        pa.field("block_error", pa.string()),
        pa.field("archived_at", pa.timestamp("us", tz="UTC")),
        pa.field(PAYLOAD_COLUMN, pa.bool_()),
    ]
)

ARCHIVE_LOG_ARROW = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("start_ms", pa.int64(), nullable=False),
        pa.field("end_ms", pa.int64(), nullable=False),
        pa.field("entries", pa.int64(), nullable=False),
        pa.field("blocks", pa.int64(), nullable=False),
        pa.field("invalid", pa.int64(), nullable=False),
        pa.field("first_id", pa.string()),
        pa.field("last_id", pa.string()),
        pa.field("run_id", pa.string()),
        pa.field("archived_at", pa.timestamp("us", tz="UTC")),
    ]
)

#: The ``blocks`` table as created: :data:`BLOCKS_ARROW` plus the weight column.
BLOCKS_TABLE_ARROW = BLOCKS_ARROW.append(pa.field(WEIGHT_COLUMN, pa.binary()))

#: table -> (arrow schema, partition columns): how the jobs create each table.
LAYOUT: dict[str, tuple[pa.Schema, tuple[str, ...]]] = {
    STREAM_ENTRIES: (STREAM_ENTRIES_ARROW, ("stream",)),
    BLOCKS: (BLOCKS_TABLE_ARROW, ("stream",)),
    ARCHIVE_LOG: (ARCHIVE_LOG_ARROW, ()),
}
