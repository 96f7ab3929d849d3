"""``redis-streams``: a PySpark Python Data Source reading one Redis stream by id range.

Options (all strings, as Spark passes them):

``url``         Redis URL (``redis://host:port/db``)
``key``         the Redis key of the stream (``pipeline.keys.stream(name)``)
``start``       first entry id, inclusive (``MS`` or ``MS-SEQ``; default ``0-0``)
``end``         entry id where reading stops, exclusive (``MS`` or ``MS-SEQ``; required)
``partitions``  how many Spark partitions to split the range into (default 4)
``pageSize``    entries per ``XRANGE`` call (default 5000)
``chain``       ``true`` to decode each entry as a chain block (default ``false``)

The reader looks up the first and last entry actually present in the range
and splits that span into ``partitions`` millisecond ranges, each read on an
executor with paged ``XRANGE`` and returned as ``pyarrow.RecordBatch`` pages
(several times faster than rows). With ``chain=true`` each entry's ``block``
field is decoded with :func:`pipeline.chain.batch.decode_block`: a valid one
fills ``block_num``, ``block_hash``, ``block_parent`` (lower-case hex); an
invalid one sets ``valid_block = false`` and ``block_error``, and is still
returned with its raw fields, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipeline.errors import ArchiveError
from pipeline.lake.redisread import (
    StreamId,
    bounds,
    connect,
    id_before,
    parse_id,
    read_pages,
    split_range,
)

NAME = "redis-streams"
DEFAULT_PARTITIONS = 4
DEFAULT_PAGE = 5000
MAX_PARTITIONS = 1024
MAX_PAGE = 100_000

SCHEMA_DDL = (
    "entry_id STRING, entry_ms BIGINT, entry_seq BIGINT, fields MAP<STRING, BINARY>, "
    "valid_block BOOLEAN, block_num BIGINT, block_hash STRING, block_parent STRING, "
    "block_error STRING"
)

ARROW_SCHEMA = pa.schema(
    [
        ("entry_id", pa.string()),
        ("entry_ms", pa.int64()),
        ("entry_seq", pa.int64()),
        ("fields", pa.map_(pa.string(), pa.binary())),
        ("valid_block", pa.bool_()),
        ("block_num", pa.int64()),
        ("block_hash", pa.string()),
        ("block_parent", pa.string()),
        ("block_error", pa.string()),
    ]
)

# --- entries -> arrow ----------------------------------------------------------


def entries_to_batch(
    entries: Sequence[tuple[bytes, dict[bytes, bytes]]], chain: bool
) -> pa.RecordBatch:
    """One page of ``XRANGE`` output as a record batch of :data:`ARROW_SCHEMA`."""
    from pipeline.chain.batch import ENTRY_FIELD, decode_block
    from pipeline.errors import BadBatch

    n = len(entries)
    ids: list[str] = []
    ms_list: list[int] = []
    seq_list: list[int] = []
    offsets = [0]
    keys: list[str] = []
    values: list[bytes] = []
    valid: list[bool | None] = [None] * n
    nums: list[int | None] = [None] * n
    hashes: list[str | None] = [None] * n
    parents: list[str | None] = [None] * n
    errors: list[str | None] = [None] * n
    for i, (raw_id, fields) in enumerate(entries):
        entry_id = raw_id.decode()
        ms_text, _, seq_text = entry_id.partition("-")
        ids.append(entry_id)
        ms_list.append(int(ms_text))
        seq_list.append(int(seq_text))
        for k, v in fields.items():
            keys.append(k.decode("utf-8", "backslashreplace"))
            values.append(v)
        offsets.append(len(keys))
        if chain:
            data = fields.get(ENTRY_FIELD)
            if data is None:
                valid[i], errors[i] = False, "entry has no 'block' field"
                continue
            try:
                block = decode_block(data)
            except BadBatch as exc:
                valid[i], errors[i] = False, str(exc)[:500]
                continue
            valid[i], nums[i] = True, block.num
            hashes[i], parents[i] = block.hash.hex(), block.parent.hex()
    fields_array = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.binary())
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids, pa.string()),
            pa.array(ms_list, pa.int64()),
            pa.array(seq_list, pa.int64()),
            fields_array,
            pa.array(valid, pa.bool_()),
            pa.array(nums, pa.int64()),
            pa.array(hashes, pa.string()),
            pa.array(parents, pa.string()),
            pa.array(errors, pa.string()),
        ],
        schema=ARROW_SCHEMA,
    )


# --- the data source ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    url: str
    key: str
    start: StreamId
    end_incl: StreamId | None
    partitions: int
    page: int
    chain: bool

    @classmethod
    def parse(cls, options: Any) -> Options:
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        try:
            url, key, end_text = opts["url"], opts["key"], opts["end"]
        except KeyError as exc:
            raise ArchiveError(f"{NAME}: option {exc.args[0]!r} is required") from exc
        try:
            start = parse_id(opts.get("start", "0-0"))
            end = parse_id(end_text)
            partitions = int(opts.get("partitions", DEFAULT_PARTITIONS))
            page = int(opts.get("pagesize", DEFAULT_PAGE))
        except ValueError as exc:
            raise ArchiveError(f"{NAME}: bad option: {exc}") from exc
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ArchiveError(f"{NAME}: partitions must be 1..{MAX_PARTITIONS}")
        if not 1 <= page <= MAX_PAGE:
            raise ArchiveError(f"{NAME}: pageSize must be 1..{MAX_PAGE}")
        chain = opts.get("chain", "false").lower() in ("1", "true", "yes")
        return cls(url, key, start, id_before(end), partitions, page, chain)


class RangePartition(InputPartition):
    """One inclusive id range ``[lo, hi]`` (empty when ``lo > hi``)."""

    def __init__(self, lo: StreamId, hi: StreamId) -> None:
        super().__init__((lo, hi))
        self.lo = lo
        self.hi = hi


_EMPTY = RangePartition((1, 0), (0, 0))


class RedisStreamsReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        if o.end_incl is None or o.start > o.end_incl:
            return [_EMPTY]
        client = connect(o.url)
        try:
            found = bounds(client, o.key, o.start, o.end_incl)
        finally:
            client.close()
        if found is None:
            return [_EMPTY]
        return [RangePartition(lo, hi) for lo, hi in split_range(*found, o.partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        o = self.options
        if not isinstance(partition, RangePartition) or partition.lo > partition.hi:
            return
        client = connect(o.url)
        try:
            for page in read_pages(client, o.key, partition.lo, partition.hi, o.page):
                yield entries_to_batch(page, o.chain)
        finally:
            client.close()


class RedisStreamsDataSource(DataSource):
    """Batch reads of one Redis stream by id range; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return RedisStreamsReader(Options.parse(self.options))


def register(spark: Any) -> None:
    """Make ``spark.read.format("redis-streams")`` available in this session."""
    spark.dataSource.register(RedisStreamsDataSource)
