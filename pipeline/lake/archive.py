"""Archive one stream's entries of one time interval into the lake.

Theory of operation, for ``archive_interval(stream, A, B)``:

1. Check on the driver that Redis answers, that the stream key exists and
   that the interval is closed (``B`` <= Redis' clock: no auto-id entry can
   still land in it).
2. Read ids ``[A-0, B-0)`` once through the ``redis-streams`` data source
   (which also decodes chain blocks) and write them to ``stream_entries``:
   a plain atomic ``replaceWhere`` of the interval when the lake has no entry
   of it yet, else an insert-only MERGE on ``(stream, entry_id)``. Entries
   already archived are never rewritten or deleted, so a rerun after Redis
   was trimmed loses nothing.
3. Derive ``blocks`` from the archived entries of the interval (read back
   from Delta, not from Redis again): an insert-only MERGE on
   ``(stream, num, hash)`` (append when that num range is empty). New blocks
   get ``canonical = false``; :mod:`pipeline.lake.canonical` marks them.
4. Record the interval in ``archive_log`` (insert-only MERGE on
   ``(stream, start_ms, end_ms)``), last: a log row proves the entries and
   blocks are committed.

Every step is one atomic Delta commit and is idempotent, so a job killed at
any point leaves nothing half-written visible and a rerun completes it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline import keys
from pipeline.errors import ArchiveError, LakeError, LakePathError, RedisUnavailable
from pipeline.lake import source, tables
from pipeline.lake.jobs import ensure_tables, run_spark, table_sql
from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: At most this many invalid entry ids are returned (the count is always exact).
MAX_REPORTED_INVALID = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveResult:
    """What the lake holds for one archived interval after the run."""

    stream: str
    start_ms: int
    end_ms: int
    #: entries of the interval in ``stream_entries``
    entries: int
    #: valid block entries of the interval (chain streams; 0 otherwise)
    blocks: int
    #: chain entries that are not valid blocks (archived raw, valid_block = false)
    invalid: int
    invalid_ids: tuple[str, ...]
    first_id: str | None
    last_id: str | None
    seconds: float


def archive_interval(
    spark: Any,
    settings: Settings,
    stream: str,
    start_ms: int,
    end_ms: int,
    *,
    run_id: str | None = None,
) -> ArchiveResult:
    """Archive entries of ``stream`` with ids in ``[start_ms-0, end_ms-0)``; idempotent."""
    began = time.perf_counter()
    if not 0 <= start_ms < end_ms:
        raise ArchiveError(f"bad interval [{start_ms}, {end_ms}) for stream {stream!r}")
    key = keys.stream(stream)
    chain = stream in settings.chain_streams
    _check_redis(settings, stream, key, end_ms)
    lake = settings.lake
    ensure_tables(spark, lake)
    archived_at = datetime.now(UTC)

    def work() -> ArchiveResult:
        _write_entries(spark, settings, stream, key, start_ms, end_ms, chain, archived_at)
        back = _interval_entries(spark, settings, stream, start_ms, end_ms)
        stats = _stats(back)
        invalid_ids: tuple[str, ...] = ()
        if stats["invalid"]:
            rows = (
                back.where("valid_block = false")
                .orderBy("entry_ms", "entry_seq")
                .select("entry_id")
                .limit(MAX_REPORTED_INVALID)
                .collect()
            )
            invalid_ids = tuple(r["entry_id"] for r in rows)
            log.warning(
                "stream %s [%d, %d): %d entries are not valid blocks (archived raw), e.g. %s",
                stream, start_ms, end_ms, stats["invalid"], ", ".join(invalid_ids[:5]),
            )  # fmt: skip
        if chain and stats["blocks"]:
            _write_blocks(spark, settings, stream, back, stats, archived_at)
        result = ArchiveResult(
            stream=stream,
            start_ms=start_ms,
            end_ms=end_ms,
            entries=stats["entries"],
            blocks=stats["blocks"],
            invalid=stats["invalid"],
            invalid_ids=invalid_ids,
            first_id=stats["first_id"],
            last_id=stats["last_id"],
            seconds=0.0,
        )
        _write_log(spark, settings, result, run_id, archived_at)
        return result

    result = run_spark(f"archive of {stream!r} [{start_ms}, {end_ms})", work)
    return _with_seconds(result, time.perf_counter() - began)


def _with_seconds(result: ArchiveResult, seconds: float) -> ArchiveResult:
    from dataclasses import replace

    return replace(result, seconds=round(seconds, 3))


def _check_redis(settings: Settings, stream: str, key: str, end_ms: int) -> None:
    import redis

    client = source.connect(settings.redis_url)
    try:
        kind = client.type(key)
        seconds, micros = client.time()
    except redis.ConnectionError as exc:
        raise RedisUnavailable(
            f"redis at {settings.redis.host}:{settings.redis.port} is unavailable: {exc}"
        ) from exc
    finally:
        client.close()
    if kind == b"none":
        raise ArchiveError(f"stream {stream!r} does not exist (no Redis key {key})")
    if kind != b"stream":
        raise ArchiveError(f"Redis key {key} of {stream!r} is a {kind.decode()}, not a stream")
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    if end_ms > now_ms:
        raise ArchiveError(
            f"interval of {stream!r} ends at {end_ms}, after Redis' clock ({now_ms}): "
            "it is not closed yet"
        )


def _interval_predicate(stream: str, start_ms: int, end_ms: int) -> str:
    return f"stream = '{_sql_str(stream)}' AND entry_ms >= {start_ms} AND entry_ms < {end_ms}"


def _sql_str(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _write_entries(
    spark: Any,
    settings: Settings,
    stream: str,
    key: str,
    start_ms: int,
    end_ms: int,
    chain: bool,
    archived_at: datetime,
) -> None:
    from pyspark.sql import functions as F

    source.register(spark)
    raw = (
        spark.read.format(source.NAME)
        .option("url", settings.redis_url)
        .option("key", key)
        .option("start", f"{start_ms}-0")
        .option("end", f"{end_ms}-0")
        .option("partitions", str(settings.archive_partitions))
        .option("chain", "true" if chain else "false")
        .load()
    )
    entries = raw.select(
        F.lit(stream).alias("stream"),
        "entry_id",
        "entry_ms",
        "entry_seq",
        "fields",
        "valid_block",
        "block_num",
        "block_hash",
        "block_parent",
        "block_error",
        F.lit(archived_at).alias("archived_at"),
    )
    lake = settings.lake
    predicate = _interval_predicate(stream, start_ms, end_ms)
    target = table_sql(lake, tables.STREAM_ENTRIES)
    if spark.sql(f"SELECT 1 FROM {target} WHERE {predicate} LIMIT 1").count() == 0:
        (
            entries.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", predicate)
            .save(lake.table(tables.STREAM_ENTRIES))
        )
        return
    entries.createOrReplaceTempView("sluice_new_entries")
    spark.sql(
        f"MERGE INTO {target} t USING sluice_new_entries s "
        f"ON t.stream = s.stream AND t.entry_ms >= {start_ms} AND t.entry_ms < {end_ms} "
        "AND t.entry_id = s.entry_id "
        "WHEN NOT MATCHED THEN INSERT *"
    )


def _interval_entries(
    spark: Any, settings: Settings, stream: str, start_ms: int, end_ms: int
) -> Any:
    return (
        spark.read.format("delta")
        .load(settings.lake.table(tables.STREAM_ENTRIES))
        .where(_interval_predicate(stream, start_ms, end_ms))
    )


def _stats(back: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    row = back.agg(
        F.count(F.lit(1)).alias("entries"),
        F.count(F.when(F.col("valid_block"), 1)).alias("blocks"),
        F.count(F.when(~F.col("valid_block"), 1)).alias("invalid"),
        F.min("block_num").alias("lo"),
        F.max("block_num").alias("hi"),
        F.count_distinct("block_hash").alias("hashes"),
        F.min(F.struct("entry_ms", "entry_seq", "entry_id")).alias("first"),
        F.max(F.struct("entry_ms", "entry_seq", "entry_id")).alias("last"),
    ).collect()[0]
    return {
        "entries": int(row["entries"]),
        "blocks": int(row["blocks"]),
        "invalid": int(row["invalid"]),
        "lo": row["lo"],
        "hi": row["hi"],
        "hashes": int(row["hashes"]),
        "first_id": row["first"]["entry_id"] if row["first"] else None,
        "last_id": row["last"]["entry_id"] if row["last"] else None,
    }


def _write_blocks(
    spark: Any,
    settings: Settings,
    stream: str,
    back: Any,
    stats: dict[str, Any],
    archived_at: datetime,
) -> None:
    from pyspark.sql import functions as F

    valid = back.where("valid_block = true")
    if stats["hashes"] < stats["blocks"]:
        # The same block was published twice in the interval: keep its first entry.
        first = F.min(F.struct("entry_ms", "entry_seq", "entry_id", "block_num", "block_parent"))
        firsts = (
            valid.groupBy("block_hash")
            .agg(first.alias("f"))
            .select(
                "block_hash",
                F.col("f.entry_ms").alias("entry_ms"),
                F.col("f.entry_seq").alias("entry_seq"),
            )
        )
        valid = valid.join(firsts, ["block_hash", "entry_ms", "entry_seq"], "left_semi")
    rows = valid.select(
        F.lit(stream).alias("stream"),
        F.col("block_num").alias("num"),
        F.col("block_hash").alias("hash"),
        F.col("block_parent").alias("parent"),
        F.lit(False).alias("canonical"),
        "entry_id",
        "entry_ms",
        F.col("fields").getItem("block").alias("payload"),
        F.lit(archived_at).alias("archived_at"),
    )
    lake = settings.lake
    lo, hi = int(stats["lo"]), int(stats["hi"])
    predicate = f"stream = '{_sql_str(stream)}' AND num >= {lo} AND num <= {hi}"
    target = table_sql(lake, tables.BLOCKS)
    if spark.sql(f"SELECT 1 FROM {target} WHERE {predicate} LIMIT 1").count() == 0:
        (
            rows.sortWithinPartitions("num")
            .write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", predicate)
            .save(lake.table(tables.BLOCKS))
        )
        return
    rows.createOrReplaceTempView("sluice_new_blocks")
    spark.sql(
        f"MERGE INTO {target} t USING sluice_new_blocks s "
        f"ON t.stream = s.stream AND t.num >= {lo} AND t.num <= {hi} "
        "AND t.num = s.num AND t.hash = s.hash "
        "WHEN NOT MATCHED THEN INSERT *"
    )


def _write_log(
    spark: Any, settings: Settings, result: ArchiveResult, run_id: str | None, archived_at: datetime
) -> None:
    row = spark.createDataFrame(
        [
            (
                result.stream,
                result.start_ms,
                result.end_ms,
                result.entries,
                result.blocks,
                result.invalid,
                result.first_id,
                result.last_id,
                run_id,
                archived_at,
            )
        ],
        schema=tables.ARCHIVE_LOG_DDL,
    )
    row.createOrReplaceTempView("sluice_new_log")
    spark.sql(
        f"MERGE INTO {table_sql(settings.lake, tables.ARCHIVE_LOG)} t USING sluice_new_log s "
        "ON t.stream = s.stream AND t.start_ms = s.start_ms AND t.end_ms = s.end_ms "
        "WHEN NOT MATCHED THEN INSERT *"
    )


__all__ = ["ArchiveResult", "LakeError", "LakePathError", "archive_interval"]
