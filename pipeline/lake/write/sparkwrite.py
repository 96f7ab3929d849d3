"""The archive's Spark writer: Delta writes of Spark DataFrames read by the ``redis-streams`` source.

What :mod:`pipeline.lake.archive` runs with ``SLUICE_ARCHIVE_WRITER=spark``
(local lakes only), or when the tables are not in the layout the Arrow and
merge writers write. :mod:`pipeline.lake.write.mergewrite` reproduces its rows.
Steps 2 to 5 of the archive's theory of operation; the read (step 2) is
:mod:`pipeline.lake.write.sparkread`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.storage import tables
from pipeline.lake.storage.intervalstats import Stats, any_rows, interval_stats
from pipeline.lake.write.heights import set_aside
from pipeline.lake.write.jobs import table_sql
from pipeline.lake.write.sparkread import keep, read_interval, release, scan
from pipeline.lake.write.writejob import WriteJob
from pipeline.settings import LakeSettings

#: ``mark`` of an entry whose hash ``blocks`` holds from another entry (keeps its payload)
_DUP = "dup"
#: ``mark`` of an entry whose ``blocks`` row is already in the table (from this entry)
_PRESENT = "present"
#: ``mark`` of an entry whose block is set aside (keeps its payload, like a ``dup``)
_ASIDE = "aside"
#: New blocks without their parent one height down in the read that the driver takes at
#: once; more are judged from every new block's keys.
MAX_LOOSE = 10_000
_BLOCK_KEY = "block"
#: Marks of at most this many entries are broadcast to the writes' joins (a broadcast
#: relation is built whole on the driver); more are joined by a shuffle instead.
MAX_BROADCAST_MARKS = 100_000


def write(spark: Any, job: WriteJob, empty: bool) -> Stats:
    """Read the interval from Redis once and write ``blocks`` then ``stream_entries`` from it.

    Returns what ``stream_entries`` holds for the interval afterwards. A chain
    stream's read is cached in Spark for its two writes (and released after),
    so Redis is read and each payload's head decoded once. ``empty``: the lake
    holds no entry of the interval (plain writes instead of MERGE).

    The driver never collects the read's rows: counts, the num range and the
    first and last ids come from Spark aggregates, the invalid ids from a
    ``limit`` of :data:`~pipeline.lake.storage.intervalstats.MAX_REPORTED_INVALID`, and the marks stay in Spark. (The
    whole read's small columns collected at once, ~110 MB per million entries,
    lost task results in a 1g local driver; see issue 9.)
    """
    settings, stream, start_ms, end_ms = job.settings, job.stream, job.start_ms, job.end_ms
    archived_at, lap, lake = job.archived_at, job.lap, job.settings.lake
    raw = read_interval(spark, settings, job.key, start_ms, end_ms, job.chain)
    if not job.chain:
        _write_entries(spark, lake, stream, start_ms, end_ms, raw, None, empty, archived_at)
        lap("entries")
        stats = interval_stats(lake, stream, start_ms, end_ms)
        lap("stats")
        return stats
    raw = keep(spark, raw)
    marks = None
    try:
        read, repeats = scan(raw)
        lap("scan")
        plan = _plan_blocks(spark, job, raw, read, repeats)
        marks = plan.marks
        lap("plan")
        if plan.write:
            _write_blocks(spark, lake, stream, raw, plan, archived_at)
            lap("blocks")
        _write_entries(spark, lake, stream, start_ms, end_ms, raw, plan, empty, archived_at)
        lap("entries")
    finally:
        if marks is not None:
            release(marks)
        release(raw)
    if empty:
        return read  # the lake held nothing of the interval: it now holds exactly what was read
    stats = interval_stats(lake, stream, start_ms, end_ms)
    lap("stats")
    return stats


def _write_entries(
    spark: Any,
    lake: LakeSettings,
    stream: str,
    start_ms: int,
    end_ms: int,
    raw: Any,
    plan: _BlocksPlan | None,
    empty: bool,
    archived_at: datetime,
) -> None:
    """Insert the read entries into ``stream_entries`` (see :data:`tables.PAYLOAD_COLUMN`).

    A valid block entry whose one field is the block keeps it out of
    ``fields`` (``payload_in_blocks``) when ``blocks`` holds it from this very
    entry; one marked ``dup`` (``blocks`` holds its hash from another entry)
    gets its field back. Non-chain entries have ``payload_in_blocks`` null.
    """
    from pyspark.sql import functions as F

    # The source emptied the fields of each valid entry whose one field is its block.
    split = F.col("valid_block") & (F.size("fields") == 0)
    if plan is not None and plan.marks is not None:
        raw = raw.join(plan.joinable(), "entry_id", "left")
        in_blocks = split & F.coalesce(F.col("mark") == F.lit(_PRESENT), F.lit(True))
        fields = F.when(
            split & ~in_blocks, F.create_map(F.lit(_BLOCK_KEY), F.col("payload"))
        ).otherwise(F.col("fields"))
    else:
        in_blocks = split
        fields = F.col("fields")
    entries = raw.select(
        F.lit(stream).alias("stream"),
        "entry_id",
        "entry_ms",
        "entry_seq",
        fields.alias("fields"),
        "valid_block",
        "block_num",
        "block_hash",
        "block_parent",
        "block_error",
        F.lit(archived_at).alias("archived_at"),
        in_blocks.alias(tables.PAYLOAD_COLUMN),
    )
    _insert_rows(
        spark,
        entries,
        lake,
        tables.STREAM_ENTRIES,
        replace_where=_interval_predicate(stream, start_ms, end_ms),
        empty=empty,
        match=f"t.stream = s.stream AND t.entry_ms >= {start_ms} AND t.entry_ms < {end_ms} "
        "AND t.entry_id = s.entry_id",
    )


def _insert_rows(
    spark: Any,
    rows: Any,
    lake: LakeSettings,
    table: str,
    *,
    replace_where: str,
    empty: bool,
    match: str,
) -> None:
    """Insert ``rows`` into ``table`` in one atomic Delta commit, never rewriting a row.

    When the lake holds nothing under ``replace_where`` a plain ``replaceWhere``
    write is enough (and cheapest); otherwise an insert-only MERGE on ``match``
    (``t`` the table, ``s`` the new rows) adds just the missing rows.
    """
    if empty:
        # No sort: rows arrive in entry order, so per-file stats stay tight and
        # readers sort each file's rows themselves.
        (
            rows.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", replace_where)
            .save(lake.table(table))
        )
        return
    view = f"sluice_new_{table}"
    rows.createOrReplaceTempView(view)
    spark.sql(
        f"MERGE INTO {table_sql(lake, table)} t USING {view} s "
        f"ON {match} WHEN NOT MATCHED THEN INSERT *"
    )


@dataclass(frozen=True, slots=True)
class _BlocksPlan:
    #: rows of ``blocks`` to write (0: nothing to write)
    write: int
    #: True when ``blocks`` holds no row of the interval's num range (replaceWhere is safe)
    empty: bool
    lo: int
    hi: int
    #: ``(entry_id, mark)`` of the valid entries that are not plain new blocks (a
    #: cached DataFrame, never collected), or None when there is none
    marks: Any = None
    #: rows of ``marks``
    marked: int = 0

    def joinable(self) -> Any:
        """``marks`` for a join: broadcast when small (:data:`MAX_BROADCAST_MARKS`), else as is."""
        from pyspark.sql import functions as F

        return F.broadcast(self.marks) if self.marked <= MAX_BROADCAST_MARKS else self.marks


def _plan_blocks(spark: Any, job: WriteJob, raw: Any, read: Stats, repeats: int) -> _BlocksPlan:
    """Which valid entries become ``blocks`` rows: the first entry of each hash not in
    ``blocks``, unless its height lies.

    The common interval (every hash new and seen once, no height that lies)
    needs no marks. Else each other valid entry is marked ``present``
    (``blocks`` holds its row from this very entry: a rerun), ``dup``
    (``blocks`` holds the hash from another entry, whose payload may differ:
    this entry keeps its own) or ``aside`` (:func:`_aside`). The marks are
    computed and cached in Spark; the driver only counts them.
    """
    if not read.blocks:
        return _BlocksPlan(0, True, 0, 0)
    lake, stream = job.settings.lake, job.stream
    lo, hi = int(read.lo or 0), int(read.hi or 0)
    present = any_rows(lake, tables.BLOCKS, stream, "num", lo, hi)
    marks = None
    if present or repeats:
        marks = keep(spark, _marks(spark, lake, stream, raw, lo, hi, present))
    earlier = None
    try:
        aside = _aside(spark, job, raw, marks)
        if aside is not None:
            earlier, marks = (
                marks,
                keep(spark, aside if marks is None else marks.unionByName(aside)),
            )
        marked = 0 if marks is None else int(marks.count())
    except BaseException:
        for frame in (marks, earlier):
            if frame is not None:
                release(frame)
        raise
    if earlier is not None:
        release(earlier)  # the union's cache holds its rows now
    if not marked:
        if marks is not None:
            release(marks)
        return _BlocksPlan(read.blocks, not present, lo, hi)
    return _BlocksPlan(read.blocks - marked, not present, lo, hi, marks, marked)


def _aside(spark: Any, job: WriteJob, raw: Any, marks: Any) -> Any:
    """``(entry_id, mark)`` of the new blocks set aside (told to ``job.heights``), or None."""
    from pyspark.sql import functions as F

    lake, stream = job.settings.lake, job.stream
    new = raw.where(F.col("valid_block"))
    if marks is not None:
        new = new.join(marks, "entry_id", "left_anti")
    new = new.select(
        "entry_id", F.col("block_num").alias("num"), F.col("block_hash").alias("hash"),
        F.col("block_parent").alias("parent"),
    )  # fmt: skip
    # One Spark job: the new blocks whose parent is not one height down among them, each
    # with its parent's height in the read (null: not in it).
    ups = new.select(F.col("hash").alias("up"), F.col("num").alias("up_num"))
    joined = new.join(ups, F.col("parent") == F.col("up"), "left")
    honest = F.col("up_num").isNotNull() & (F.col("up_num") == F.col("num") - 1)
    loose = joined.where(~honest).limit(MAX_LOOSE + 1).toArrow()
    if loose.num_rows > MAX_LOOSE:
        aside = set_aside(lake, stream, new.toArrow())
    else:
        known = loose.filter(pc.is_valid(loose.column("up_num")))
        context = pa.table({"hash": known.column("up"), "num": known.column("up_num")})
        aside = set_aside(lake, stream, loose, context)
        if len(aside.entry_ids):  # the blocks above them are judged from every new block
            aside = set_aside(lake, stream, new.toArrow())
    job.heights.add(aside)
    if not len(aside.entry_ids):
        return None
    ids = [(entry_id, _ASIDE) for entry_id in aside.entry_ids.to_pylist()]
    return spark.createDataFrame(ids, "entry_id STRING, mark STRING")


def _marks(
    spark: Any, lake: LakeSettings, stream: str, raw: Any, lo: int, hi: int, present: bool
) -> Any:
    """``(entry_id, mark)`` of the valid entries of ``raw`` that do not add a ``blocks`` row.

    In entry order per hash, the first entry of a hash ``blocks`` does not hold
    is new (unmarked) and any later one is ``dup``; an entry whose hash
    ``blocks`` holds is ``present`` when that row is its own, else ``dup``.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy("block_hash").orderBy("entry_ms", "entry_seq")
    ranked = (
        raw.where(F.col("valid_block"))
        .select("entry_id", "entry_ms", "entry_seq", "block_hash")
        .withColumn("nth", F.row_number().over(order))
    )
    if not present:
        return ranked.where(F.col("nth") > 1).select("entry_id", F.lit(_DUP).alias("mark"))
    owners = (
        spark.read.format("delta")
        .load(lake.table(tables.BLOCKS))
        .where((F.col("stream") == F.lit(stream)) & F.col("num").between(lo, hi))
        .groupBy(F.col("hash").alias("block_hash"))
        .agg(F.collect_set("entry_id").alias("owners"))
    )
    owned = F.col("owners").isNotNull()
    mark = F.when(owned & F.array_contains("owners", F.col("entry_id")), F.lit(_PRESENT))
    return (
        ranked.join(owners, "block_hash", "left")
        .where(owned | (F.col("nth") > 1))
        .select("entry_id", mark.otherwise(F.lit(_DUP)).alias("mark"))
    )


def _write_blocks(
    spark: Any,
    lake: LakeSettings,
    stream: str,
    raw: Any,
    plan: _BlocksPlan,
    archived_at: datetime,
) -> None:
    """Insert the planned new blocks (payload and weight as read) into ``blocks``."""
    from pyspark.sql import functions as F

    valid = raw.where(F.col("valid_block"))
    if plan.marks is not None:
        valid = valid.join(plan.joinable(), "entry_id", "left_anti")
    rows = valid.select(
        F.lit(stream).alias("stream"),
        F.col("block_num").alias("num"),
        F.col("block_hash").alias("hash"),
        F.col("block_parent").alias("parent"),
        F.lit(False).alias("canonical"),
        "entry_id",
        "entry_ms",
        "payload",
        F.lit(archived_at).alias("archived_at"),
        F.col("weight").alias(tables.WEIGHT_COLUMN),
    )
    lo, hi = plan.lo, plan.hi
    _insert_rows(
        spark,
        rows,
        lake,
        tables.BLOCKS,
        replace_where=f"stream = '{_sql_str(stream)}' AND num >= {lo} AND num <= {hi}",
        empty=plan.empty,
        match=f"t.stream = s.stream AND t.num >= {lo} AND t.num <= {hi} "
        "AND t.num = s.num AND t.hash = s.hash",
    )


def _interval_predicate(stream: str, start_ms: int, end_ms: int) -> str:
    return f"stream = '{_sql_str(stream)}' AND entry_ms >= {start_ms} AND entry_ms < {end_ms}"


def _sql_str(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")
