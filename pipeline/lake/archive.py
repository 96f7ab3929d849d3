"""Archive one stream's entries of one time interval into the lake.

Theory of operation, for ``archive_interval(stream, A, B)``:

1. Check on the driver that Redis answers, that the stream key exists, that
   the interval is closed (``B`` <= Redis' clock: no auto-id entry can
   still land in it), and that the stream's first and last entries do not
   contradict ``SLUICE_CHAIN_STREAMS`` (blocks in a stream it does not name,
   none in one it does: :class:`~pipeline.errors.StreamKindError`, nothing
   written).
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
   ``canonical = false``; :mod:`pipeline.lake.canonical` marks them), but
   not one whose height is not its known parent's plus one, nor any block
   above such a one: those stay raw entries (:mod:`pipeline.lake.write.heights`;
   counted in ``bad_height`` and ``set_aside``, logged once). A
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

Steps 2 to 5 have two writers (``settings.lake.archive_writer``; chosen by
:mod:`pipeline.lake.archivewrite`, and step 6 is :mod:`pipeline.lake.archivelog`). The Spark
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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pipeline import keys
from pipeline.errors import ArchiveError, LakeError, LakePathError, RedisUnavailable
from pipeline.lake.archivelog import logged_entries, write_log
from pipeline.lake.archivewrite import write_interval
from pipeline.lake.intake import streamset
from pipeline.lake.intake.redisread import connect
from pipeline.lake.logsnapshot import LogSnapshot
from pipeline.lake.storage.intervalstats import Stats, interval_stats
from pipeline.lake.write.heights import Heights
from pipeline.lake.write.jobs import ensure_tables, run_spark
from pipeline.lake.write.writejob import WriteJob
from pipeline.settings import Settings

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
    #: new blocks whose height is not their known parent's plus one (kept out of ``blocks``)
    bad_height: int = 0
    #: the first of them: ``[hash, num, parent's height]``
    bad_height_blocks: tuple[tuple[str, int, int], ...] = ()
    #: those and the blocks above them, all archived as raw entries only
    set_aside: int = 0
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
    snapshot: LogSnapshot | None = None,
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
    A shared job passes ``shared`` (:class:`pipeline.lake.write.arrowbatch.SharedWrites`:
    Spark jobs, commits and log rows run with other streams') and ``snapshot``
    (:class:`~pipeline.lake.logsnapshot.LogSnapshot`: ``archive_log`` read once).
    """
    clock = _StageClock()
    if not 0 <= start_ms < end_ms:
        raise ArchiveError(f"bad interval [{start_ms}, {end_ms}) for stream {stream!r}")
    key = keys.stream(stream)
    chain = streamset.is_chain(settings.lake, stream)
    in_redis = _check_redis(settings, stream, key, start_ms, end_ms)
    _ensure_tables(lake := settings.lake, shared)
    job = WriteJob(
        settings=settings, stream=stream, key=key, start_ms=start_ms, end_ms=end_ms,
        chain=chain, archived_at=datetime.now(UTC), lap=clock.lap, shared=shared,
    )  # fmt: skip
    done = None if force else _logged(lake, stream, start_ms, end_ms, snapshot)
    clock.lap("check")
    work = partial(_archive, spark, job, done=done, in_redis=in_redis, force=force)
    result, read, skipped = run_spark(f"archive of {stream!r} [{start_ms}, {end_ms})", work)
    if guard is not None:
        guard()
    write_log(lake, result, run_id, job.archived_at, shared)
    if snapshot is not None:
        snapshot.add(stream, start_ms, end_ms, result.entries)
    clock.lap("log")
    seconds = round(time.perf_counter() - clock.began, 3)
    heights = job.heights
    _log_heights(stream, start_ms, end_ms, heights)
    return replace(
        result, seconds=seconds, read=read, skipped=skipped, stages=clock.stages,
        bad_height=heights.bad, bad_height_blocks=tuple(heights.named), set_aside=heights.aside,
    )  # fmt: skip


def _ensure_tables(lake: Any, shared: Any) -> None:
    """The lake's tables, created if missing: once per shared job (the same for every stream)."""
    if shared is not None:
        shared.once("tables", partial(ensure_tables, lake))
    else:
        ensure_tables(lake)


def _logged(
    lake: Any, stream: str, start_ms: int, end_ms: int, snapshot: LogSnapshot | None
) -> int | None:
    """The entries ``archive_log`` records for the interval (from a shared job's snapshot)."""
    if snapshot is not None:
        return snapshot.entries(stream, start_ms, end_ms)
    return logged_entries(lake, stream, start_ms, end_ms)


def _log_heights(stream: str, start_ms: int, end_ms: int, heights: Heights) -> None:
    """One line for the blocks the run kept out of ``blocks`` (none: nothing)."""
    where = f"stream {stream} [{start_ms}, {end_ms})"
    if heights.named:
        digest, num, parent = heights.named[0]
        log.warning(
            "%s: %d block(s) set aside (raw entries, not blocks): height not the parent's plus "
            "one (first: %s at %d, its parent at %d); %d with the blocks above them",
            where, heights.bad, digest, num, parent, heights.aside,
        )  # fmt: skip
    elif heights.aside:
        log.warning(
            "%s: %d block(s) set aside (raw entries, not blocks): above a block an earlier run "
            "set aside", where, heights.aside,
        )  # fmt: skip


class _StageClock:
    """The run's stage timer: seconds per stage, in the order the stages ran."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.stages: dict[str, float] = {}
        self._last = self.began

    def lap(self, name: str, seconds: float | None = None) -> None:
        """Add the time since the last lap to stage ``name`` (or record ``seconds`` for it)."""
        if seconds is not None:
            self.stages[name] = round(seconds, 3)
            return
        now = time.perf_counter()
        self.stages[name] = round(self.stages.get(name, 0.0) + now - self._last, 3)
        self._last = now


def _archive(
    spark: Any, job: WriteJob, *, done: int | None, in_redis: bool, force: bool
) -> tuple[ArchiveResult, int, bool]:
    """Write the interval unless the lake holds it already or Redis holds none of it.

    Returns what the lake holds of it (``seconds`` left 0), how many entries this
    run read from Redis, and whether it found the interval archived already.
    """
    lake, stream, start_ms, end_ms = job.settings.lake, job.stream, job.start_ms, job.end_ms
    read, skipped = 0, False
    stats = (
        interval_stats(lake, stream, start_ms, end_ms) if done is not None or not in_redis else None
    )
    if stats is not None and (stats.entries == done or not in_redis):
        skipped = stats.entries == done
        if skipped:
            log.info("stream %s [%d, %d) is archived already", stream, start_ms, end_ms)
        else:
            log.info("stream %s [%d, %d): nothing in Redis to archive", stream, start_ms, end_ms)
    else:
        before = stats.entries if stats is not None else 0
        stats = write_interval(spark, job)
        read = stats.entries - before if force else stats.entries
    if stats.invalid_ids:
        log.warning(
            "stream %s [%d, %d): %d entries are not valid blocks (archived raw), e.g. %s",
            stream, start_ms, end_ms, stats.invalid, ", ".join(stats.invalid_ids[:5]),
        )  # fmt: skip
    return _result(job, stats), read, skipped


def _result(job: WriteJob, stats: Stats) -> ArchiveResult:
    return ArchiveResult(
        stream=job.stream,
        start_ms=job.start_ms,
        end_ms=job.end_ms,
        entries=stats.entries,
        blocks=stats.blocks,
        invalid=stats.invalid,
        invalid_ids=stats.invalid_ids,
        first_id=stats.first_id,
        last_id=stats.last_id,
        seconds=0.0,
    )


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
        looks = streamset.sample(client, key) if kind == b"stream" else []
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
    streamset.check_kind(settings.lake, stream, looks)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    if end_ms > now_ms:
        raise ArchiveError(
            f"interval of {stream!r} ends at {end_ms}, after Redis' clock ({now_ms}): "
            "it is not closed yet"
        )
    return bool(first)


__all__ = ["ArchiveResult", "LakeError", "LakePathError", "archive_interval"]
