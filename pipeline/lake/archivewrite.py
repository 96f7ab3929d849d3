"""Which writer archives an interval, and the Arrow writer's run for it (steps 2 to 5 of the archive).

:func:`write_interval` picks the writer (:mod:`pipeline.lake.archive` says
when each one runs): the Arrow writer for an interval the lake holds nothing
of, the merge writer for one it holds part of, the Spark writer when
``archive_writer = spark`` or the tables are not in the Arrow layout.
:func:`_write_arrow` runs the Arrow writer: Spark tasks write the files, the
driver fixes what the tasks could not settle alone and commits them,
``blocks`` first.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline.errors import ConfigError, LakeError
from pipeline.lake.intake.redisread import DEFAULT_PAGE, MAX_SEQ
from pipeline.lake.storage import store, tables
from pipeline.lake.storage.intervalstats import Stats, any_rows
from pipeline.lake.write import arrowfix, arrowwrite, mergewrite, sparkwrite
from pipeline.lake.write.arrowwrite import WriteOptions, Written
from pipeline.lake.write.jobs import delta_retry
from pipeline.lake.write.writejob import WriteJob
from pipeline.settings import LakeSettings

# A name under pipeline.lake.archive: a backfill's story hides this INFO line as it
# hides the archive's own (pipeline.lake.cli's quiet filter matches the prefix).
log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_STATS_KEY = "delta.dataSkippingStatsColumns"


def write_interval(spark: Any, job: WriteJob) -> Stats:
    """Read the interval from Redis once and write ``blocks`` then ``stream_entries`` from it.

    Returns what ``stream_entries`` holds for the interval afterwards. The
    Arrow writer (:func:`_write_arrow`) takes the common case; otherwise a
    chain stream's read is cached in Spark for its two writes (and released
    after), so Redis is read and each payload's head decoded once.
    """
    lake = job.settings.lake

    def layout() -> bool:
        ensure_entries_columns(lake)
        return _arrow_writer(lake)

    # the same for every stream of a shared job: checked once per job
    arrow = job.shared.once("layout", layout) if job.shared is not None else layout()
    empty = not any_rows(
        lake, tables.STREAM_ENTRIES, job.stream, "entry_ms", job.start_ms, job.end_ms - 1
    )
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
    shared = job.shared
    write_files = shared.write_files if shared is not None else arrowwrite.write_files
    written = write_files(spark, _write_options(job))
    for name, seconds in written.stages.items():
        job.lap(name, seconds)
    job.lap("files")
    written = _fix(job, written)
    _commit(job, written)
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


def _write_options(job: WriteJob) -> WriteOptions:
    """The :class:`~pipeline.lake.write.arrowwrite.WriteOptions` of ``job``'s interval."""
    lake = job.settings.lake
    return WriteOptions(
        url=job.settings.redis.url,
        key=job.key,
        chain=job.chain,
        first=(job.start_ms, 0),
        last=(job.end_ms - 1, MAX_SEQ),
        partitions=lake.archive_partitions,
        range_entries=lake.archive_range_entries,
        page=DEFAULT_PAGE,
        entries_table=lake.table(tables.STREAM_ENTRIES),
        blocks_table=lake.table(tables.BLOCKS),
        stream=job.stream,
        archived_at_us=(job.archived_at - _EPOCH) // timedelta(microseconds=1),
        storage_options=lake.storage_options(),
    )


def _fix(job: WriteJob, written: Written) -> Written:
    """``written``, with the files holding a hash the tasks could not settle alone
    rewritten (:mod:`pipeline.lake.write.arrowfix`)."""
    lake, stream = job.settings.lake, job.stream
    fix = arrowfix.plan_fix(lake, stream, written, job.heights)
    job.lap("plan")
    if fix is None:
        return written
    log.info(
        "stream %s [%d, %d): %d blocks of the interval are in the lake already, repeat a "
        "hash across its ranges or are set aside; rewriting %d of its files",
        stream, job.start_ms, job.end_ms, len(fix.drop),
        len(fix.blocks_files) + len(fix.entries_files),
    )  # fmt: skip
    fixed = arrowfix.apply_fix(lake, stream, written, fix)
    job.lap("fix")
    return fixed


def _commit(job: WriteJob, written: Written) -> None:
    """Commit the written files: ``blocks``, then ``stream_entries``, one append each."""
    lake, stream, shared = job.settings.lake, job.stream, job.shared
    # A row of stream_entries may say its payload is in blocks: blocks commits first.
    commit = shared.commit if shared is not None else arrowwrite.commit
    storage = lake.storage_options()
    if written.blocks_files:
        commit(lake.table(tables.BLOCKS), written.blocks_files, stream, storage)
        job.lap("commit_blocks")
    commit(lake.table(tables.STREAM_ENTRIES), written.entries_files, stream, storage)
    job.lap("commit_entries")


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
