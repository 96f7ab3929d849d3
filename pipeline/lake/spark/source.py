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
entry's ``block`` field is decoded (:mod:`pipeline.lake.intake.blockhead`): a valid
block fills ``block_num``, ``block_hash``, ``block_parent`` (lower-case hex),
``payload`` (the field's bytes) and ``weight`` (32 bytes big-endian, null when
the block has none); an invalid one sets ``valid_block = false`` and
``block_error``, and is still returned with its raw fields, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipeline.errors import ArchiveError, BadBatch
from pipeline.lake.intake.blockhead import HeadReader, page_heads
from pipeline.lake.intake.redisread import (
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
    """:func:`raw_to_batch` of entries as redis-py's ``xrange`` returns them (id, dict)."""
    page = [
        [entry_id, [x for pair in fields.items() for x in pair]] for entry_id, fields in entries
    ]
    return raw_to_batch(page, chain, split=split, heads=heads)


def raw_to_batch(
    page: Sequence[Sequence[Any]],
    chain: bool,
    *,
    split: bool = False,
    heads: HeadReader | None = None,
) -> pa.RecordBatch:
    """One page of raw ``XRANGE`` replies (:func:`~pipeline.lake.intake.redisread.read_raw_pages`:
    ``[id, [field, value, ...]]`` each) as a record batch of :data:`ARROW_SCHEMA`.

    Fields read as redis-py's dict would (a repeated field name keeps its first
    place and its last value). A valid block's ``block`` field is also returned
    as ``payload`` (with its ``weight`` as 32 bytes); with ``split``, an entry
    whose one field is that block gets empty ``fields`` (the archive stores the
    payload once, in ``blocks``; an entry with other fields too keeps them all,
    in their order). Only the block's head is decoded
    (:mod:`pipeline.lake.intake.blockhead`); ids are split and hashes hex-encoded in Arrow.
    """

    n = len(page)
    ids = pa.array([e[0] for e in page], pa.binary()).cast(pa.string())
    parts = pc.split_pattern(ids, "-", max_splits=1)
    ms = pc.cast(pc.list_element(parts, 0), pa.int64())
    seq = pc.cast(pc.list_element(parts, 1), pa.int64())
    offsets = [0]
    keys: list[bytes] = []
    values: list[bytes] = []
    if not chain:
        for _, flat in page:
            _add_fields(flat, keys, values)
            offsets.append(len(keys))
        nulls = pa.nulls(n)
        columns = [nulls.cast(t) for t in _BLOCK_TYPES]
        return _batch(ids, ms, seq, offsets, keys, values, columns)
    return _chain_batch(page, ids, ms, seq, split, heads or HeadReader())


def _chain_batch(
    page: Sequence[Sequence[Any]],
    ids: pa.Array,
    ms: pa.Array,
    seq: pa.Array,
    split: bool,
    heads: HeadReader,
) -> pa.RecordBatch:
    """:func:`raw_to_batch` of a chain stream: heads read a page at a time
    (:func:`~pipeline.lake.intake.blockhead.page_heads`), one by one only where that cannot."""
    from pipeline.blockcodec import ENTRY_FIELD, HASH_LEN, WEIGHT_BYTES

    n = len(page)
    flats = [e[1] for e in page]
    datas: list[bytes | None] = [
        f[1] if len(f) == 2 and f[0] == ENTRY_FIELD else None for f in flats
    ]
    one = np.ones(n, dtype=np.bool_)
    # Rare: several fields (a repeated name counts once, as in a dict).
    for i in [i for i, flat in enumerate(flats) if len(flat) != 2]:
        pairs = dict(zip(flats[i][::2], flats[i][1::2], strict=True))
        datas[i], one[i] = pairs.get(ENTRY_FIELD), len(pairs) == 1
    payloads = pa.array(datas, pa.binary())
    found = page_heads(payloads)
    valid, nums, has_weight = found.ok.copy(), found.num.copy(), found.has_weight.copy()
    hashes, parents, weights = found.hash.copy(), found.parent.copy(), found.weight.copy()
    errors: list[str | None] = [None] * n
    for i in np.flatnonzero(~found.ok).tolist():
        data = datas[i]
        if data is None:
            errors[i] = "entry has no 'block' field"
            continue
        try:
            num, block_hash, parent, weight = heads.head(data)
        except BadBatch as exc:
            errors[i] = str(exc)[:500]
            continue
        valid[i], nums[i] = True, num
        hashes[i] = np.frombuffer(block_hash, dtype=np.uint8)
        parents[i] = np.frombuffer(parent, dtype=np.uint8)
        if weight is not None:
            has_weight[i] = True
            weights[i] = np.frombuffer(weight, dtype=np.uint8)
    keep = ~(valid & one) if split else np.ones(n, dtype=np.bool_)
    counts = np.zeros(n, dtype=np.int32)
    keys: list[bytes] = []
    values: list[bytes] = []
    for i in np.flatnonzero(keep).tolist():
        before = len(keys)
        _add_fields(flats[i], keys, values)
        counts[i] = len(keys) - before
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    invalid = ~valid
    columns = [
        pa.array(valid, pa.bool_()),
        pa.array(nums, pa.int64(), mask=invalid),
        _hex_rows(hashes, invalid, HASH_LEN),
        _hex_rows(parents, invalid, HASH_LEN),
        pa.array(errors, pa.string()),
        pc.if_else(pa.array(valid), payloads, pa.scalar(None, pa.binary())),
        _binary_rows(weights, ~has_weight, WEIGHT_BYTES),
    ]
    return _batch(ids, ms, seq, offsets, keys, values, columns)


def _binary_rows(rows: np.ndarray[Any, Any], null: np.ndarray[Any, Any], width: int) -> pa.Array:
    """Each row of an (n, width) uint8 array as one binary value (null where ``null``)."""
    n = len(rows)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    values = pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rows.tobytes())]
    )
    return pc.if_else(pa.array(~null), values, pa.scalar(None, pa.binary()))


def _hex_rows(rows: np.ndarray[Any, Any], null: np.ndarray[Any, Any], width: int) -> pa.Array:
    """Lower-case hex of each row of an (n, width) uint8 array (null where ``null``)."""
    n = len(rows)
    offsets = np.arange(0, (n + 1) * 2 * width, 2 * width, dtype=np.int32)
    values = pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(_HEX[rows].tobytes())
    )
    return pc.if_else(pa.array(~null), values, pa.scalar(None, pa.string()))


def _add_fields(flat: Sequence[bytes], keys: list[bytes], values: list[bytes]) -> None:
    if len(flat) == 2:
        keys.append(flat[0])
        values.append(flat[1])
        return
    pairs = dict(zip(flat[::2], flat[1::2], strict=True))
    keys.extend(pairs)
    values.extend(pairs.values())


#: byte -> its two lower-case hex digits, as one little-endian uint16
_HEX = np.frombuffer(b"".join(f"{b:02x}".encode() for b in range(256)), dtype="<u2")


def hex_array(data: pa.Array) -> pa.Array:
    """Lower-case hex of each value of a binary array (nulls stay null), vectorized."""
    data = data.cast(pa.binary())
    if len(data) == 0:
        return pa.array([], pa.string())
    if data.offset:
        data = pa.concat_arrays([data])  # a slice: rebase its buffers
    validity, offsets_buf, values_buf = data.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=len(data) + 1)
    raw = np.frombuffer(values_buf, dtype=np.uint8, count=int(offsets[-1]))
    digits = _HEX[raw].tobytes()
    return pa.StringArray.from_buffers(
        len(data), pa.py_buffer(offsets * 2), pa.py_buffer(digits), validity, data.null_count
    )


_BLOCK_TYPES = [f.type for f in ARROW_SCHEMA][4:]


def _batch(
    ids: pa.Array,
    ms: pa.Array,
    seq: pa.Array,
    offsets: list[int] | np.ndarray[Any, Any],
    keys: list[bytes],
    values: list[bytes],
    columns: list[pa.Array],
) -> pa.RecordBatch:
    # Field names as text: invalid UTF-8 bytes become backslash escapes (as
    # ``bytes.decode("utf-8", "backslashreplace")``); the common names are ASCII.
    names = pa.array(keys, pa.binary())
    try:
        text = names.cast(pa.string())
    except pa.ArrowInvalid:
        text = pa.array([k.decode("utf-8", "backslashreplace") for k in keys], pa.string())
    fields_array = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), text, pa.array(values, pa.binary())
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
