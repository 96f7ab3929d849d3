"""Trim a Redis stream, never below what ``archive_log`` proves archived.

``safe_trim`` reads ``archive_log`` with delta-rs (no Spark), merges the
logged intervals of the stream into contiguous coverage, and keeps only the
run of coverage that contains the oldest entry still in Redis: a gap in the
log stops it, and so does an oldest entry outside every logged interval (an
entry nobody archived). The stream is then trimmed with ``XTRIM MINID`` to the
lower of that coverage's end and ``now - hot_retention_s``. For a chain
stream it also stops below the oldest block the canonical job has yet to mark
(:func:`pipeline.lake.storage.chainwalk.pending`): another run may have archived
blocks it has not marked yet, and the server serves the lake's canonical rows
only, so cutting them from Redis first would leave a gap.

Before trimming, the stream's first and last entries are checked against
``SLUICE_CHAIN_STREAMS`` (:func:`pipeline.lake.intake.streamset.check_kind`):
blocks in a stream it does not name (trim would not keep its unmarked
blocks), or none in one it does, refuse the trim with nothing trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline import keys
from pipeline.errors import LakePathError, RedisUnavailable
from pipeline.intervals import covered_until
from pipeline.lake.intake.redisread import connect, parse_id
from pipeline.lake.intake.streamset import check_kind, is_chain, sample
from pipeline.lake.storage import store, tables
from pipeline.lake.storage.chainwalk import pending
from pipeline.settings import LakeSettings, Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class TrimResult:
    stream: str
    #: entries with ids below ``min_id`` were trimmed ("" when nothing was trimmed)
    min_id: str
    trimmed: int
    #: end (exclusive, ms) of the archived coverage that holds the oldest entry, if any
    covered_to_ms: int | None


def logged_intervals(lake: LakeSettings, stream: str) -> list[tuple[int, int]]:
    """The ``[start_ms, end_ms)`` intervals ``archive_log`` records for ``stream``."""

    if not store.is_table(lake, tables.ARCHIVE_LOG):
        return []
    try:
        table = (
            store.open_table(lake, tables.ARCHIVE_LOG)
            .to_pyarrow_dataset()
            .to_table(columns=["start_ms", "end_ms"], filter=stream_is(stream))
        )
    except OSError as exc:
        uri = lake.table(tables.ARCHIVE_LOG)
        raise LakePathError(f"cannot read {uri}: {store.describe(exc)}") from exc
    return list(
        zip(table.column("start_ms").to_pylist(), table.column("end_ms").to_pylist(), strict=True)
    )


def stream_is(stream: str) -> Any:
    """The dataset filter ``stream = <stream>`` on ``archive_log``.

    Cast first: delta-rs' MERGE writes ``stream`` as ``string_view``, and pyarrow
    has no ``string = string_view`` kernel. A file whose statistics settle the
    filter never meets it; a file of several streams' rows (one MERGE of a
    shared job's rows) does.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.field("stream").cast(pa.string()) == stream


def safe_trim(
    settings: Settings,
    stream: str,
    *,
    now_ms: int | None = None,
    intervals: list[tuple[int, int]] | None = None,
) -> TrimResult:
    """``XTRIM MINID`` the stream of ``stream`` to what is both archived and out of hot retention.

    ``intervals`` are the stream's ``archive_log`` intervals when the caller read
    them already (:class:`~pipeline.lake.logsnapshot.LogSnapshot`); read from the log otherwise.
    """

    from pipeline.redisio.conn import UNAVAILABLE

    key = keys.stream(stream)
    if intervals is None:
        intervals = logged_intervals(settings.lake, stream)
    client = connect(settings.redis.url)
    try:
        oldest = client.xrange(key, "-", "+", count=1)
        if not oldest:
            return TrimResult(stream=stream, min_id="", trimmed=0, covered_to_ms=None)
        check_kind(settings.lake, stream, sample(client, key))
        covered = covered_until(intervals, parse_id(oldest[0][0])[0])
        if now_ms is None:
            seconds, micros = client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
        if covered is None:
            return TrimResult(stream=stream, min_id="", trimmed=0, covered_to_ms=None)
        limit = min(covered, now_ms - settings.lake.hot_retention_s * 1000)
        if is_chain(settings.lake, stream):
            unmarked = pending(settings.lake, stream).mark
            if unmarked:
                limit = min(limit, min(node.order[0] for node in unmarked))
        if limit <= 0:
            return TrimResult(stream=stream, min_id="", trimmed=0, covered_to_ms=covered)
        min_id = f"{limit}-0"
        trimmed = int(client.xtrim(key, minid=min_id, approximate=False))
    except UNAVAILABLE as exc:
        raise RedisUnavailable(f"redis unavailable while trimming {stream!r}: {exc}") from exc
    finally:
        client.close()
    return TrimResult(stream=stream, min_id=min_id, trimmed=trimmed, covered_to_ms=covered)
