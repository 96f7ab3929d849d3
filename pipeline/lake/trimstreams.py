"""Trim several streams in one job: ``sluice lake trim-streams --stream A --stream B ...``.

What each ``sluice_archive`` run starts once after its archive, instead of one
``trim`` job per stream: each job child pays for its process, its imports and
its first open of ``archive_log`` (about a second together), while trimming a
stream costs a few milliseconds. ``archive_log`` is read once for all streams
(:class:`pipeline.lake.logsnapshot.LogSnapshot`, taken before any stream is
trimmed: a row logged meanwhile only makes the next run trim further).

Per stream, :data:`WORKERS` at once, under the stream's archive lock: what
``sluice lake trim`` does (:func:`pipeline.lake.trim.safe_trim`). A stream
that fails is recorded with its error and the job goes on with the next one;
after Redis was lost the streams not tried yet are recorded as failed with
that cause. The result names every stream given, each with its trim result or
``error``; ``failed`` lists the failed ones and the job's ``ok`` is False when
one did (the CLI still prints the JSON and exits 1). A stop (SIGTERM) raises
:class:`JobCancelled` and ends the whole job.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from pipeline.errors import JobCancelled, RedisUnavailable
from pipeline.lake.batch import message
from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Streams trimmed at once: each trim is a few Redis round trips and its lock's, so a
#: thousand streams one after the other took 13 s, mostly waiting on Redis.
WORKERS = 16


def trim_streams(
    settings: Settings,
    streams: Sequence[str],
    *,
    now_ms: int | None = None,
    locked: Callable[[str], AbstractContextManager[Any]],
    check: Callable[[], None],
) -> tuple[dict[str, Any], bool]:
    """Trim every stream; returns (result, ok). See the module doc."""
    from pipeline.lake.logsnapshot import LogSnapshot
    from pipeline.lake.trim import safe_trim

    names = list(dict.fromkeys(streams))
    logged = LogSnapshot(settings.lake, names, 0, 0)  # the named streams' runs, one read
    results: dict[str, dict[str, Any]] = {}
    fatal: list[str] = []
    guard = threading.Lock()

    def one(stream: str) -> None:
        with guard:
            if fatal:
                results[stream] = {"stream": stream, "error": f"not tried: {fatal[0]}"}
                return
        try:
            check()
            with locked(stream):
                done = safe_trim(
                    settings, stream, now_ms=now_ms, intervals=logged.intervals(stream)
                )
        except JobCancelled:
            raise
        except Exception as exc:  # one stream's failure must not stop the others
            check()
            text = message(exc)
            log.error("stream %s: trim failed: %s", stream, text)
            log.debug("stream %s: trim failed", stream, exc_info=True)
            with guard:
                if isinstance(exc, RedisUnavailable) and not fatal:
                    fatal.append(text)
                results[stream] = {"stream": stream, "error": text}
            return
        with guard:
            results[stream] = dataclasses.asdict(done)
        if done.trimmed:
            log.info("stream %s: trimmed %d entries below %s", stream, done.trimmed, done.min_id)

    workers = max(1, min(WORKERS, len(names)))
    with ThreadPoolExecutor(workers, thread_name_prefix="sluice-trim") as pool:
        futures = [pool.submit(one, stream) for stream in names]
        try:
            for future in futures:
                future.result()  # a JobCancelled (a stop) ends the job here
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    results = {name: results[name] for name in names}
    failed = [name for name, result in results.items() if "error" in result]
    trimmed = sum(int(r.get("trimmed") or 0) for r in results.values())
    log.info("trimmed %d entries from %d stream(s), %d failed", trimmed, len(names), len(failed))
    return {"streams": results, "failed": failed}, not failed
