"""Archive one data interval of several streams in one job: one process, one Spark session.

``sluice lake archive-streams --stream A --stream B ... --start-ms S --end-ms E
[--run-id R] [--catchup]`` is what each ``sluice_archive`` DAG run starts once,
instead of one job per stream (each job pays for its process and its Spark
session: see the DAG's docstring for the figures). Per stream, in the order given:

- with ``catchup``: first the holes ``archive_log`` shows for the stream before
  the interval (:func:`pipeline.lake.catchup.archive_steps`), oldest first,
  while the job is within its catch-up budget (half the job's time limit, for
  all streams together); then the interval itself, always;
- all of it under the stream's archive lock, taken for this stream and
  released before the next one;
- a stream that fails is recorded with its error and the job goes on with the
  next one. After the Spark server or Redis was lost, the streams not tried
  yet are recorded as failed with that cause (each would wait and fail the
  same way); so are the streams left when 90% of the job's time limit has
  passed (the limit kills the job as a whole, and what it finished must
  still be reported).

What a caller can rely on: the result names every stream it was given, each
with its own archive result (what ``sluice lake archive`` prints, plus
``caught_up`` and the ``warnings`` it logged) or with ``error``; ``failed``
lists the streams that failed, and the job's ``ok`` is False when one did (the
CLI still prints the JSON and exits 1). The DAG's per-stream task then
archives that stream on its own, with its own retries. A stop (SIGTERM) is not
a stream failure: :class:`JobCancelled` ends the whole job, and nothing is
logged as archived after it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from pipeline.errors import JobCancelled, RedisUnavailable, SluiceError, SparkUnavailable
from pipeline.lake.catchup import CAUGHT_UP_FIELDS, archive_steps
from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Errors after which the streams not tried yet are not tried (they would fail the same way).
FATAL = (SparkUnavailable, RedisUnavailable)
#: Share of the job's time limit after which no further stream is started.
START_WITHIN = 0.9


def archive_streams(
    spark: Any,
    settings: Settings,
    streams: Sequence[str],
    start_ms: int,
    end_ms: int,
    *,
    run_id: str | None = None,
    catchup: bool = False,
    locked: Callable[[str], AbstractContextManager[Any]],
    check: Callable[[], None],
    warnings: Callable[[], int] = lambda: 0,
    report: Callable[[dict[str, Any], float], None] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Archive ``[start_ms, end_ms)`` of every stream; returns (result, ok). See the module doc.

    ``locked(stream)`` holds the stream's archive lock; ``check`` is called
    before each commit of the log and after a failure (it raises
    :class:`JobCancelled` once the job is being stopped); ``warnings()`` is the
    number of WARNING-or-worse records the job logged so far (each stream's
    share is its difference); ``report(result, seconds)`` is told each
    stream's own-interval result (the CLI logs its summary lines).
    """
    from pipeline.lake.archive import archive_interval
    from pipeline.lake.trim import logged_intervals

    if not 0 <= start_ms < end_ms:
        raise SluiceError(f"bad interval [{start_ms}, {end_ms})")
    names = list(dict.fromkeys(streams))
    began_job = time.monotonic()
    budget = began_job + settings.lake.job_timeout_s / 2
    last_start = began_job + settings.lake.job_timeout_s * START_WITHIN
    results: dict[str, dict[str, Any]] = {}
    fatal: str | None = None

    def step(stream: str, lo: int, hi: int) -> tuple[dict[str, Any], int]:
        before = warnings()
        result = archive_interval(spark, settings, stream, lo, hi, run_id=run_id, guard=check)
        return dataclasses.asdict(result), warnings() - before

    for stream in names:
        if fatal is None and time.monotonic() > last_start:
            fatal = f"{START_WITHIN:.0%} of the job's {settings.lake.job_timeout_s}s limit passed"
            log.warning(
                "%s: %d stream(s) left to their own tasks", fatal, len(names) - len(results)
            )
        if fatal is not None:
            results[stream] = {"stream": stream, "error": f"not tried: {fatal}", "warnings": 0}
            continue
        began, before = time.perf_counter(), warnings()
        try:
            with locked(stream):
                steps = [(start_ms, end_ms)]
                if catchup:
                    logged = logged_intervals(settings.lake, stream)
                    steps = archive_steps(logged, start_ms, end_ms)
                if len(steps) > 1:
                    log.info(
                        "stream %s: archiving %d earlier interval(s) no run archived yet, "
                        "first [%d, %d)", stream, len(steps) - 1, *steps[0],
                    )  # fmt: skip
                caught_up: list[dict[str, Any]] = []
                for done, (lo, hi) in enumerate(steps[:-1]):
                    if time.monotonic() > budget:
                        log.warning(
                            "stream %s: %d earlier interval(s) left for the next run (time budget)",
                            stream, len(steps) - 1 - done,
                        )  # fmt: skip
                        break
                    earlier, warned = step(stream, lo, hi)
                    caught_up.append(
                        {k: earlier.get(k) for k in CAUGHT_UP_FIELDS} | {"warnings": warned}
                    )
                own, _ = step(stream, start_ms, end_ms)
        except JobCancelled:
            raise
        except Exception as exc:  # one stream's failure must not stop the others
            check()  # a stop made the work fail: that is the stop, not this stream's error
            message = _message(exc)
            log.error("stream %s: archive failed: %s", stream, message)
            log.debug("stream %s: archive failed", stream, exc_info=True)
            if isinstance(exc, FATAL):
                fatal = message
            results[stream] = {"stream": stream, "error": message, "warnings": warnings() - before}
            continue
        seconds = time.perf_counter() - began
        if catchup:
            own["caught_up"] = caught_up
        own["warnings"] = warnings() - before
        if report is not None:
            report(own, seconds)
        results[stream] = own
    failed = [name for name, result in results.items() if "error" in result]
    return {
        "start_ms": start_ms,
        "end_ms": end_ms,
        "streams": results,
        "failed": failed,
    }, not failed


def _message(exc: BaseException) -> str:
    """One line naming what failed (Sluice errors carry their own; others their type)."""
    text = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else ""
    if isinstance(exc, SluiceError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
