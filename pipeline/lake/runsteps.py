"""The steps one archive run takes for one stream, from ``archive_log`` and Redis.

:func:`run_steps` reads what :func:`pipeline.lake.catchup.archive_steps` plans
from: the stream's ``archive_log`` intervals (delta-rs), its oldest entry in
Redis and, for each stretch to catch up, where its next entry lies (one
``XRANGE ... COUNT 1`` each, on one connection). Called under the stream's
archive lock, so another job's commits of the stream are all visible, except
when a shared job passes its :class:`~pipeline.lake.logsnapshot.LogSnapshot`
(whose module doc says what that costs: never a wrong row).
"""

from __future__ import annotations

from typing import Any

from pipeline import keys
from pipeline.errors import RedisUnavailable
from pipeline.lake.catchup import archive_steps
from pipeline.lake.intake.redisread import connect, parse_id
from pipeline.lake.logsnapshot import LogSnapshot
from pipeline.settings import Settings


def run_steps(
    settings: Settings,
    stream: str,
    start_ms: int,
    end_ms: int,
    snapshot: LogSnapshot | None = None,
) -> list[tuple[int, int]]:
    """The intervals the run of ``[start_ms, end_ms)`` archives for ``stream``, oldest first.

    A stream that Redis holds entries of below its coverage (or below the
    interval, when nothing covers it yet) is archived from its first entry,
    bounded as :func:`~pipeline.lake.catchup.archive_steps` says. The stream's
    log intervals come from ``snapshot`` when a shared job took one, else from
    ``archive_log``. Raises :class:`RedisUnavailable` when Redis does not answer.
    """
    from pipeline.lake.trim import logged_intervals
    from pipeline.redisio.conn import UNAVAILABLE

    if snapshot is not None:
        logged = snapshot.intervals(stream)
    else:
        logged = logged_intervals(settings.lake, stream)
    key = keys.stream(stream)
    client = connect(settings.redis.url)
    try:
        if client.type(key) != b"stream":  # the archive itself says what is wrong with it
            return archive_steps(logged, start_ms, end_ms)
        oldest = _first_at(client, key, 0)
        return archive_steps(
            logged,
            start_ms,
            end_ms,
            oldest_ms=oldest,
            next_entry=lambda ms: _first_at(client, key, ms),
        )
    except UNAVAILABLE as exc:
        raise RedisUnavailable(
            f"redis at {settings.redis.host}:{settings.redis.port} is unavailable: {exc}"
        ) from exc
    finally:
        client.close()


def _first_at(client: Any, key: str, ms: int) -> int | None:
    """The millisecond of the first entry of stream ``key`` at or after ``ms`` (None: none)."""
    found = client.xrange(key, f"{ms}-0", "+", count=1)
    return parse_id(found[0][0])[0] if found else None
