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
(several times faster than rows), in the schema of
:data:`pipeline.lake.intake.arrowpage.ARROW_SCHEMA` (:data:`SCHEMA_DDL` is the
same for Spark). With ``chain=true`` the head of each entry's ``block`` field
is decoded (:func:`~pipeline.lake.intake.arrowpage.raw_to_batch` says what a
valid and an invalid block give); an invalid block is still returned with its
raw fields, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipeline.errors import ArchiveError
from pipeline.lake.intake.arrowpage import raw_to_batch
from pipeline.lake.intake.blockhead import HeadReader
from pipeline.lake.intake.redisread import (
    DEFAULT_PAGE,
    StreamId,
    bounds,
    connect,
    id_before,
    parse_id,
    raw_connect,
    read_raw_pages,
    split_range,
)

NAME = "redis-streams"
DEFAULT_PARTITIONS = 4
MAX_PARTITIONS = 1024
MAX_PAGE = 100_000

SCHEMA_DDL = (
    "entry_id STRING, entry_ms BIGINT, entry_seq BIGINT, fields MAP<STRING, BINARY>, "
    "valid_block BOOLEAN, block_num BIGINT, block_hash STRING, block_parent STRING, "
    "block_error STRING, payload BINARY, weight BINARY"
)


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
        client = raw_connect(o.url)
        heads = HeadReader()
        try:
            for page in read_raw_pages(client, o.key, partition.lo, partition.hi, o.page):
                yield raw_to_batch(page, o.chain, split=o.split, heads=heads)
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
