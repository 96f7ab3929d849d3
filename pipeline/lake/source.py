"""``redis-streams``: a PySpark Python Data Source reading one Redis stream by id range.

Options (all strings, as Spark passes them):

``url``         Redis URL (``redis://host:port/db``)
``key``         the Redis key of the stream (``pipeline.keys.stream(name)``)
``start``       first entry id, inclusive (``MS`` or ``MS-SEQ``; default ``0-0``)
``end``         entry id where reading stops, exclusive (``MS`` or ``MS-SEQ``; required)
``partitions``  how many Spark partitions to split the range into (default 4)
``pageSize``    entries per ``XRANGE`` call (default 5000)
``chain``       ``true`` to decode each entry as a chain block (default ``false``)
``splitPayload`` ``true``: a valid block entry whose one field is ``block`` gets
                empty ``fields`` (its bytes are in ``payload`` either way; default ``false``)

The reader looks up the first and last entry actually present in the range
and splits that span into ``partitions`` millisecond ranges, each read on an
executor with paged ``XRANGE`` and returned as ``pyarrow.RecordBatch`` pages
(several times faster than rows). With ``chain=true`` the head of each
entry's ``block`` field is decoded (:mod:`pipeline.lake.blockhead`): a valid
block fills ``block_num``, ``block_hash``, ``block_parent`` (lower-case hex),
``payload`` (the field's bytes) and ``weight`` (32 bytes big-endian, null when
the block has none); an invalid one sets ``valid_block = false`` and
``block_error``, and is still returned with its raw fields, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipeline.errors import ArchiveError, BadBatch
from pipeline.lake.blockhead import HeadReader
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
    "block_error STRING, payload BINARY, weight BINARY"
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
        ("payload", pa.binary()),
        ("weight", pa.binary()),
    ]
)

# --- entries -> arrow ----------------------------------------------------------


def entries_to_batch(
    entries: Sequence[tuple[bytes, dict[bytes, bytes]]],
    chain: bool,
    *,
    split: bool = False,
    heads: HeadReader | None = None,
) -> pa.RecordBatch:
    """One page of ``XRANGE`` output as a record batch of :data:`ARROW_SCHEMA`.

    A valid block's ``block`` field is also returned as ``payload`` (with its
    ``weight`` as 32 bytes); with ``split``, an entry whose one field is that
    block gets empty ``fields`` (the archive stores the payload once, in
    ``blocks``; an entry with other fields too keeps them all, in their order).
    Only the block's head is decoded (:mod:`pipeline.lake.blockhead`); ids are
    split in Arrow.
    """
    from pipeline.chain.batch import ENTRY_FIELD

    n = len(entries)
    ids = pa.array([e[0] for e in entries], pa.binary()).cast(pa.string())
    parts = pc.split_pattern(ids, "-", max_splits=1)
    ms = pc.cast(pc.list_element(parts, 0), pa.int64())
    seq = pc.cast(pc.list_element(parts, 1), pa.int64())
    offsets = [0]
    keys: list[str] = []
    values: list[bytes] = []
    if not chain:
        for _, fields in entries:
            for k, v in fields.items():
                keys.append(k.decode("utf-8", "backslashreplace"))
                values.append(v)
            offsets.append(len(keys))
        nulls = pa.nulls(n)
        columns = [nulls.cast(t) for t in _BLOCK_TYPES]
        return _batch(ids, ms, seq, offsets, keys, values, columns)
    reader = heads or HeadReader()
    head = reader.head
    valid: list[bool] = [False] * n
    nums: list[int | None] = [None] * n
    hashes: list[str | None] = [None] * n
    parents: list[str | None] = [None] * n
    errors: list[str | None] = [None] * n
    payloads: list[bytes | None] = [None] * n
    weights: list[bytes | None] = [None] * n
    for i, (_, fields) in enumerate(entries):
        data = fields.get(ENTRY_FIELD)
        if data is None:
            errors[i] = "entry has no 'block' field"
        else:
            try:
                nums[i], h, p, weights[i] = head(data)
            except BadBatch as exc:
                errors[i] = str(exc)[:500]
            else:
                valid[i] = True
                hashes[i], parents[i], payloads[i] = h.hex(), p.hex(), data
                if split and len(fields) == 1:
                    offsets.append(len(keys))  # the common entry: the block field alone
                    continue
        for k, v in fields.items():
            keys.append(k.decode("utf-8", "backslashreplace"))
            values.append(v)
        offsets.append(len(keys))
    columns = [
        pa.array(valid, pa.bool_()),
        pa.array(nums, pa.int64()),
        pa.array(hashes, pa.string()),
        pa.array(parents, pa.string()),
        pa.array(errors, pa.string()),
        pa.array(payloads, pa.binary()),
        pa.array(weights, pa.binary()),
    ]
    return _batch(ids, ms, seq, offsets, keys, values, columns)


_BLOCK_TYPES = [f.type for f in ARROW_SCHEMA][4:]


def _batch(
    ids: pa.Array,
    ms: pa.Array,
    seq: pa.Array,
    offsets: list[int],
    keys: list[str],
    values: list[bytes],
    columns: list[pa.Array],
) -> pa.RecordBatch:
    fields_array = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.binary())
    )
    return pa.RecordBatch.from_arrays([ids, ms, seq, fields_array, *columns], schema=ARROW_SCHEMA)


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
    split: bool = False

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
        chain = _flag(opts.get("chain", "false"))
        split = _flag(opts.get("splitpayload", "false"))
        return cls(url, key, start, id_before(end), partitions, page, chain, split)


def _flag(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


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
        heads = HeadReader()
        try:
            for page in read_pages(client, o.key, partition.lo, partition.hi, o.page):
                yield entries_to_batch(page, o.chain, split=o.split, heads=heads)
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
