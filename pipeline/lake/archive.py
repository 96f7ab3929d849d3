"""Archive one stream's entries of one time interval into the lake.

Theory of operation, for ``archive_interval(stream, A, B)``:

1. Check on the driver that Redis answers, that the stream key exists and
   that the interval is closed (``B`` <= Redis' clock: no auto-id entry can
   still land in it).
2. Read ids ``[A-0, B-0)`` once through the ``redis-streams`` data source,
   which decodes only each chain block's head (num, hash, parent, weight) and
   hands a valid block's payload over in its own column. For a chain stream
   the read is cached in Spark (on disk) for the two writes below and
   released after.
3. Plan in Spark from the read and the ``blocks`` rows of that num range: a
   block is new when its hash is not in ``blocks`` and this is its first
   entry. The driver gets only aggregates (counts, num range, first and last
   ids, at most 100 invalid ids); the marks stay in Spark and are joined into
   both writes (:mod:`pipeline.lake.write.sparkwrite`).
4. Write the new blocks to ``blocks`` (payload and weight as read,
   ``canonical = false``; :mod:`pipeline.lake.canonical` marks them): a
   ``replaceWhere`` on ``(stream, num range)`` when that range is empty, else
   an insert-only MERGE on ``(stream, num, hash)``.
5. Write the entries to ``stream_entries``: a plain ``replaceWhere`` of the
   interval when the lake has no entry of it yet, else an insert-only MERGE on
   ``(stream, entry_id)``. Entries already archived are never rewritten or
   deleted, so a rerun after Redis was trimmed loses nothing. Each payload is
   stored once: an entry whose one field is a block that ``blocks`` holds
   from this very entry has ``payload_in_blocks = true`` and empty ``fields``
   (``blocks`` is committed first, so such a row never points at nothing);
   any other entry keeps its whole fields. :mod:`pipeline.lake.storage.entries`
   reads entries back whole.
6. Record the interval in ``archive_log`` (insert-only MERGE on
   ``(stream, start_ms, end_ms)``), last: a log row proves the entries and
   blocks are committed.

Every step is one atomic Delta commit and is idempotent, so a job killed at
any point leaves nothing half-written visible and a rerun completes it.

Steps 2 to 5 have two writers (``settings.lake.archive_writer``). The Spark
writer (:mod:`pipeline.lake.write.sparkwrite`) is described above. The Arrow writer (:mod:`pipeline.lake.write.arrowwrite`,
the default) takes the common interval, one the lake holds nothing of: Spark
tasks read their id ranges, decode and write the Parquet files of both tables
with pyarrow (each task writes a hash's ``blocks`` row once, from its first
entry, for repeats within a window of its range:
:class:`~pipeline.lake.write.blockplan.FirstSeen`), and the driver commits them with
delta-rs, ``blocks`` first. A hash the tasks cannot settle alone (repeated
further back, across their ranges, or in ``blocks`` already) gets the files holding it rewritten
before the commits (:mod:`pipeline.lake.write.arrowfix`), so an interval with
repeated hashes keeps the fast writer. An interval the lake holds part of
(a forced rerun, entries added later with explicit ids) takes the merge
writer (:mod:`pipeline.lake.write.mergewrite`): the driver reads the interval and
appends, with delta-rs, exactly the rows the Spark writer's MERGE adds (no
Spark write). All three write the same
rows; ``archive_writer = spark`` takes the Spark writer for every interval.

On object storage Spark never writes (docs/DESIGN.md says why): the Arrow
writer and the merge writer do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pyarrow as pa

from pipeline import keys
from pipeline.errors import (
    ArchiveError,
    ConfigError,
    LakeError,
    LakePathError,
    RedisUnavailable,
)
from pipeline.lake.intake import streamset
from pipeline.lake.intake.redisread import MAX_SEQ, connect
from pipeline.lake.spark import source
from pipeline.lake.storage import store, tables
from pipeline.lake.storage.intervalstats import Stats, any_rows, interval_stats
from pipeline.lake.write import mergewrite, sparkwrite
from pipeline.lake.write.jobs import delta_retry, ensure_tables, run_spark
from pipeline.lake.write.writejob import WriteJob
from pipeline.settings import LakeSettings, Settings

log = logging.getLogger(__name__)


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
    #: entries this run read from Redis (0 when the interval was archived already
    #: or Redis holds nothing in it: no Spark work at all then)
    read: int = 0
    #: True when the run found the interval archived and read nothing
    skipped: bool = False
    #: seconds per stage, in order. Arrow writer: check, read, decode, write (each the mean
    #: seconds of one Spark task, overlapping in parallel tasks), slowest_task (its wall
    #: seconds), files (the Spark job's wall seconds), plan, commit_blocks, commit_entries,
    #: log. Spark writer: check, scan (read + decode, chain streams), plan, blocks, entries,
    #: stats (a read-back, when the lake held part of the interval), log. Merge writer
    #: (after the Arrow writer's stages when it fell back): merge_read, merge_plan,
    #: merge_blocks, merge_entries, stats, log.
    stages: dict[str, float] = field(default_factory=dict)


def archive_interval(
    spark: Any,
    settings: Settings,
    stream: str,
    start_ms: int,
    end_ms: int,
    *,
    run_id: str | None = None,
    force: bool = False,
    guard: Callable[[], None] | None = None,
    shared: Any = None,
) -> ArchiveResult:
    """Archive entries of ``stream`` with ids in ``[start_ms-0, end_ms-0)``; idempotent.

    An interval that ``archive_log`` already records (whose entries the lake
    still holds) is not read again unless ``force``: its log row is only
    written after its entries and blocks were committed, and Redis cannot
    gain auto-id entries in a closed interval. ``force`` re-reads Redis and
    merges, which picks up entries added later with explicit ids.

    Spark is touched only when there is something to write: an interval
    already archived, or one with no entry in Redis, is settled with Redis
    and delta-rs reads alone (``spark`` may be a lazy stand-in that is never
    started then). ``guard`` is called right before the ``archive_log``
    commit (the archive lock's check): if it raises, nothing is logged.
    ``shared`` (a :class:`pipeline.lake.write.arrowbatch.SharedWrites`) runs the Arrow
    writer's Spark job, its commits and the ``archive_log`` row together with
    other streams' of the same job.
    """
    began = time.perf_counter()
    stages: dict[str, float] = {}
    clock = [began]

    def lap(name: str, seconds: float | None = None) -> None:
        """Add the time since the last lap to stage ``name`` (or record ``seconds`` for it)."""
        if seconds is not None:
            stages[name] = round(seconds, 3)
            return
        now = time.perf_counter()
        stages[name] = round(stages.get(name, 0.0) + now - clock[0], 3)
        clock[0] = now

    if not 0 <= start_ms < end_ms:
        raise ArchiveError(f"bad interval [{start_ms}, {end_ms}) for stream {stream!r}")
    key = keys.stream(stream)
    chain = streamset.is_chain(settings.lake, stream)
    in_redis = _check_redis(settings, stream, key, start_ms, end_ms)
    lake = settings.lake
    ensure_tables(lake)
    archived_at = datetime.now(UTC)

    done = None if force else _logged_entries(lake, stream, start_ms, end_ms)
    lap("check")
    read = 0
    skipped = False

    def work() -> ArchiveResult:
        nonlocal read, skipped
        stats = (
            interval_stats(lake, stream, start_ms, end_ms)
            if done is not None or not in_redis
            else None
        )
        if stats is not None and (stats.entries == done or not in_redis):
            skipped = stats.entries == done
            if skipped:
                log.info("stream %s [%d, %d) is archived already", stream, start_ms, end_ms)
            else:
                log.info(
                    "stream %s [%d, %d): nothing in Redis to archive", stream, start_ms, end_ms
                )
        else:
            before = stats.entries if stats is not None else 0
            job = WriteJob(
                settings=settings, stream=stream, key=key, start_ms=start_ms, end_ms=end_ms,
                chain=chain, archived_at=archived_at, lap=lap, shared=shared,
            )  # fmt: skip
            stats = _write(spark, job)
            read = stats.entries - before if force else stats.entries
        if stats.invalid_ids:
            log.warning(
                "stream %s [%d, %d): %d entries are not valid blocks (archived raw), e.g. %s",
                stream, start_ms, end_ms, stats.invalid, ", ".join(stats.invalid_ids[:5]),
            )  # fmt: skip
        return ArchiveResult(
            stream=stream,
            start_ms=start_ms,
            end_ms=end_ms,
            entries=stats.entries,
            blocks=stats.blocks,
            invalid=stats.invalid,
            invalid_ids=stats.invalid_ids,
            first_id=stats.first_id,
            last_id=stats.last_id,
            seconds=0.0,
        )

    result = run_spark(f"archive of {stream!r} [{start_ms}, {end_ms})", work)
    if guard is not None:
        guard()
    _write_log(lake, result, run_id, archived_at, shared)
    lap("log")
    return _finish(result, time.perf_counter() - began, read, skipped, stages)


def _finish(
    result: ArchiveResult, seconds: float, read: int, skipped: bool, stages: dict[str, float]
) -> ArchiveResult:
    from dataclasses import replace

    return replace(result, seconds=round(seconds, 3), read=read, skipped=skipped, stages=stages)


def _check_redis(settings: Settings, stream: str, key: str, start_ms: int, end_ms: int) -> bool:
    """Check the stream and that the interval is closed; True when Redis holds an entry in it."""

    from pipeline.redisio.conn import UNAVAILABLE

    client = connect(settings.redis.url)
    try:
        kind = client.type(key)
        seconds, micros = client.time()
        first = (
            client.xrange(key, f"{start_ms}-0", f"({end_ms}-0", count=1)
            if kind == b"stream"
            else []
        )
    except UNAVAILABLE as exc:
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
    return bool(first)


def _write(spark: Any, job: WriteJob) -> Stats:
    """Read the interval from Redis once and write ``blocks`` then ``stream_entries`` from it.

    Returns what ``stream_entries`` holds for the interval afterwards. The
    Arrow writer (:func:`_write_arrow`) takes the common case; otherwise a
    chain stream's read is cached in Spark for its two writes (and released
    after), so Redis is read and each payload's head decoded once.
    """
    lake = job.settings.lake
    ensure_entries_columns(lake)
    empty = not any_rows(
        lake, tables.STREAM_ENTRIES, job.stream, "entry_ms", job.start_ms, job.end_ms - 1
    )
    arrow = _arrow_writer(lake)
    if arrow and empty:
        return _write_arrow(spark, job)
    if arrow:
        return mergewrite.write(job)
    if lake.remote:
        raise LakeError(
            f"archive of {job.stream!r} [{job.start_ms}, {job.end_ms}) needs a MERGE and the "
            f"tables of the lake ({lake.uri}) are not in the layout the merge writer writes "
            "(Spark does not write a lake on object storage)"
        )
    return sparkwrite.write(spark, job, empty)


def _arrow_writer(lake: LakeSettings) -> bool:
    """True when the Arrow and merge writers may write this lake's tables (else the Spark
    writer does).

    It needs ``archive_writer = arrow`` and both tables in the layout they
    write (:data:`tables.LAYOUT`). A lake on object storage takes only these
    writers (their commits go through delta-rs' conditional puts).
    """
    if lake.archive_writer not in ("arrow", "spark"):
        raise ConfigError(
            f"setting 'archive_writer' (SLUICE_ARCHIVE_WRITER) must be arrow or spark, "
            f"got {lake.archive_writer!r}"
        )
    if lake.archive_writer != "arrow":
        if lake.remote:
            raise ConfigError(
                "setting 'archive_writer' (SLUICE_ARCHIVE_WRITER) must be arrow for a lake on "
                f"object storage ({lake.uri}): Spark does not write to it"
            )
        return False
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        table = store.open_table(lake, name)
        schema, partitions = tables.LAYOUT[name]
        if table.schema().to_arrow().names != schema.names:
            return False
        if list(table.metadata().partition_columns) != list(partitions):
            return False
    return True


def _write_arrow(spark: Any, job: WriteJob) -> Stats:
    """The Arrow writer (:mod:`pipeline.lake.write.arrowwrite`) for an interval the lake holds nothing of.

    Spark tasks read, decode and write the files; the driver commits them once
    they hold exactly what the Spark writer's MERGE would write: a hash
    repeated across tasks' ranges or already in ``blocks`` gets the files
    that hold it rewritten first (:mod:`pipeline.lake.write.arrowfix`; no second
    read of Redis). Commits: ``blocks``, then ``stream_entries``, one atomic
    append each.
    """
    from pipeline.lake.write import arrowfix, arrowwrite

    settings, stream, lap = job.settings, job.stream, job.lap
    lake = settings.lake
    micros = (job.archived_at - _EPOCH) // timedelta(microseconds=1)
    shared = job.shared
    options = arrowwrite.WriteOptions(
        url=settings.redis.url,
        key=job.key,
        chain=job.chain,
        first=(job.start_ms, 0),
        last=(job.end_ms - 1, MAX_SEQ),
        partitions=lake.archive_partitions,
        page=source.DEFAULT_PAGE,
        entries_table=lake.table(tables.STREAM_ENTRIES),
        blocks_table=lake.table(tables.BLOCKS),
        stream=stream,
        archived_at_us=micros,
        storage_options=lake.storage_options(),
    )
    write_files = shared.write_files if shared is not None else arrowwrite.write_files
    written = write_files(spark, options)
    for name, seconds in written.stages.items():
        lap(name, seconds)
    lap("files")
    fix = arrowfix.plan_fix(lake, stream, written)
    lap("plan")
    if fix is not None:
        log.info(
            "stream %s [%d, %d): %d blocks of the interval are in the lake already or repeat a "
            "hash across its ranges; rewriting %d of its files",
            stream, job.start_ms, job.end_ms, len(fix.drop),
            len(fix.blocks_files) + len(fix.entries_files),
        )  # fmt: skip
        written = arrowfix.apply_fix(lake, stream, written, fix)
        lap("fix")
    # A row of stream_entries may say its payload is in blocks: blocks commits first.
    commit = shared.commit if shared is not None else arrowwrite.commit
    storage = lake.storage_options()
    if written.blocks_files:
        commit(lake.table(tables.BLOCKS), written.blocks_files, stream, storage)
        lap("commit_blocks")
    commit(lake.table(tables.STREAM_ENTRIES), written.entries_files, stream, storage)
    lap("commit_entries")
    return Stats(
        entries=written.entries,
        blocks=written.blocks,
        invalid=written.invalid,
        invalid_ids=written.invalid_ids,
        lo=written.num_lo,
        hi=written.num_hi,
        first_id=written.first_id,
        last_id=written.last_id,
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ensure_entries_columns(lake: LakeSettings) -> None:
    """Bring tables created by older versions to the current layout (metadata-only commits).

    Adds the nullable columns added since: ``blocks.weight`` (old rows read as
    null: ``num + 1``) and ``stream_entries.payload_in_blocks`` (old rows read
    as null: their ``fields`` are whole); sets :data:`tables.STATS_COLUMNS`.
    A delta-rs commit each, once: no rewrite, column mapping stays off.
    """
    _ensure_layout(lake, tables.BLOCKS, tables.WEIGHT_COLUMN, "binary")
    _ensure_layout(lake, tables.STREAM_ENTRIES, tables.PAYLOAD_COLUMN, "boolean")


def _ensure_layout(lake: LakeSettings, name: str, column: str, kind: str) -> None:
    from deltalake.schema import Field, PrimitiveType

    uri = lake.table(name)
    stats = {_STATS_KEY: tables.STATS_COLUMNS[name]}

    def add() -> None:
        table = store.open_table(lake, name)
        if column not in table.schema().to_arrow().names:
            table.alter.add_columns([Field(column, PrimitiveType(kind), nullable=True)])
        if table.metadata().configuration.get(_STATS_KEY) != stats[_STATS_KEY]:
            table.alter.set_table_properties(stats, raise_if_not_exists=False)

    delta_retry(f"layout of {uri}", add)


_STATS_KEY = "delta.dataSkippingStatsColumns"


def _logged_entries(lake: LakeSettings, stream: str, start_ms: int, end_ms: int) -> int | None:
    """The entry count ``archive_log`` records for exactly this interval, or None."""
    import pyarrow.compute as pc

    from pipeline.lake.trim import stream_is

    table = (
        store.open_table(lake, tables.ARCHIVE_LOG)
        .to_pyarrow_dataset()
        .to_table(
            columns=["entries"],
            filter=stream_is(stream)
            & (pc.field("start_ms") == start_ms)
            & (pc.field("end_ms") == end_ms),
        )
    )
    return int(table.column("entries")[0].as_py()) if table.num_rows else None


def _write_log(
    lake: LakeSettings,
    result: ArchiveResult,
    run_id: str | None,
    archived_at: datetime,
    shared: Any = None,
) -> None:
    """Insert the interval's row into ``archive_log`` (kept as is when already there).

    With ``shared``, in one MERGE with the rows other streams of the job log at once.
    """
    row = pa.Table.from_pylist(
        [
            {
                "stream": result.stream,
                "start_ms": result.start_ms,
                "end_ms": result.end_ms,
                "entries": result.entries,
                "blocks": result.blocks,
                "invalid": result.invalid,
                "first_id": result.first_id,
                "last_id": result.last_id,
                "run_id": run_id,
                "archived_at": archived_at,
            }
        ],
        schema=tables.ARCHIVE_LOG_ARROW,
    )

    def merge(rows: pa.Table) -> None:
        what = (
            f"archive_log row of {result.stream!r}"
            if rows is row
            else (f"archive_log rows of {rows.num_rows} intervals")
        )
        delta_retry(what, partial(_merge, rows))

    def _merge(rows: pa.Table) -> None:
        (
            store.open_table(lake, tables.ARCHIVE_LOG)
            .merge(
                rows,
                "t.stream = s.stream AND t.start_ms = s.start_ms AND t.end_ms = s.end_ms",
                source_alias="s",
                target_alias="t",
            )
            .when_not_matched_insert_all()
            .execute()
        )

    if shared is not None:
        shared.write_log(merge, row)
    else:
        merge(row)


__all__ = ["ArchiveResult", "LakeError", "LakePathError", "archive_interval"]
