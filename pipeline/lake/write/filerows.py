"""The rows of the lake's data files, from a batch of Redis entries decoded to Arrow.

A batch of :data:`pipeline.lake.intake.arrowpage.ARROW_SCHEMA` gives the rows
of ``stream_entries`` (:func:`entry_rows`) and of ``blocks``
(:func:`block_rows`), in the columns of each table's files: the table's
columns without the partition column ``stream``, which is in the file's path.
The Arrow writer's tasks and the merge writer both write these rows.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.storage import tables

#: The data columns of each table's files (the partition column ``stream`` is in the path).
ENTRIES_FILE = pa.schema([f for f in tables.STREAM_ENTRIES_ARROW if f.name != "stream"])
BLOCKS_FILE = pa.schema([f for f in tables.BLOCKS_TABLE_ARROW if f.name != "stream"])


def entry_rows(batch: pa.RecordBatch, archived_at: pa.Scalar) -> pa.RecordBatch:
    """``stream_entries`` file rows of a :data:`pipeline.lake.intake.arrowpage.ARROW_SCHEMA` batch.

    The same values the Spark writer derives (``sparkwrite._write_entries``):
    ``payload_in_blocks = valid_block AND size(fields) = 0``, SQL's three-valued
    AND (null for a chain row cannot occur; false for plain streams). A repeat
    of a hash has its block in ``fields`` already (:func:`~pipeline.lake.write.blockplan.restore_blocks`).
    """
    fields = batch.column("fields")
    offsets = fields.offsets
    empty = pc.equal(pc.subtract(offsets[1:], offsets[:-1]), 0)
    in_blocks = pc.and_kleene(batch.column("valid_block"), empty)
    n = batch.num_rows
    return pa.RecordBatch.from_arrays(
        [
            batch.column("entry_id"),
            batch.column("entry_ms"),
            batch.column("entry_seq"),
            fields,
            batch.column("valid_block"),
            batch.column("block_num"),
            batch.column("block_hash"),
            batch.column("block_parent"),
            batch.column("block_error"),
            pa.repeat(archived_at, n),
            in_blocks,
        ],
        schema=ENTRIES_FILE,
    )


def block_rows(good: pa.RecordBatch, archived_at: pa.Scalar) -> pa.RecordBatch:
    """``blocks`` file rows of the entries of a batch that add one (``canonical = false``)."""
    n = good.num_rows
    return pa.RecordBatch.from_arrays(
        [
            good.column("block_num"),
            good.column("block_hash"),
            good.column("block_parent"),
            pa.repeat(pa.scalar(False), n),
            good.column("entry_id"),
            good.column("entry_ms"),
            good.column("payload"),
            pa.repeat(archived_at, n),
            good.column("weight"),
        ],
        schema=BLOCKS_FILE,
    )
