"""``sluice lake JOB ...``: run one lake job and print its result as one JSON line.

Jobs: ``archive --stream S --start-ms A --end-ms B [--run-id R] [--force]``,
``archive-streams --stream S [--stream T ...] --start-ms A --end-ms B [--run-id R]
[--catchup]`` (several streams in one job: :mod:`pipeline.lake.batch`),
``canonical --stream S``, ``trim --stream S [--now-ms N]``, ``trim-streams --stream S
[--stream T ...] [--now-ms N]`` (:mod:`pipeline.lake.trimstreams`),
``replay --stream S --from N --to M [--target T]``, ``audit --stream S``,
``maintain [--retain-hours H]``, ``backfill --stream S [--since ISO |
--from-coverage] [--until ISO]`` (:mod:`pipeline.lake.backfill`). Settings come from ``Settings.load()``
(``SLUICE_LAKE_URI``, ``SLUICE_REDIS_URL``, ``SLUICE_SPARK_REMOTE``,
``SLUICE_SPARK_MASTER``...).

What a caller (a person, or the Airflow runner reading stderr) can rely on:

- stderr carries the story of the job in a few lines, each starting with its
  level name (``INFO``, ``WARNING``, ``ERROR``): what ran, on which Spark,
  what it read and wrote, how long each stage took. Spark's own output (the
  JVM's log4j, Ivy, py4j, gRPC) goes to a debug file under
  ``$SLUICE_VAR_DIR/logs/`` instead, named in the first line;
- the JSON result carries ``warnings``: how many WARNING-or-worse lines the
  job logged (an archive that kept invalid entries raw says so there too);
- backfill and replay show their progress: a rich bar when stderr is a
  terminal, else an INFO ``progress:`` line (done/total, items, rate, ETA)
  at most every few seconds and one at the end (:mod:`pipeline.lake.progress`);
- a Spark session is started only when the job needs Spark (an interval
  already archived, or with nothing in Redis, never starts one);
- archive, canonical and trim of one stream hold that stream's archive lock
  (:mod:`pipeline.lake.lock`) while they run;
- SIGTERM stops the job at once: its Spark operations are interrupted (on a
  Connect server, only this job's, by tag) and it exits 143 without
  committing anything further.

The parser and the argument checks are :mod:`pipeline.lake.jobargs`, each
job's call :mod:`pipeline.lake.jobrun`, the SIGTERM handling
:mod:`pipeline.lake.stopper`, the logging :mod:`pipeline.lake.joblog`.

Exit status: 0 done (for ``audit``: and the chain is continuous), 1 the job
failed or the audit found problems, 2 bad arguments, 143 stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pipeline.errors import JobCancelled, SluiceError
from pipeline.facade import require
from pipeline.lake.jobargs import check_args, parser
from pipeline.lake.joblog import WarningCounter, job_logging
from pipeline.lake.jobrun import run
from pipeline.lake.spark.lazyspark import LazySpark
from pipeline.lake.stopper import EXIT_CANCELLED, Stopper, stream_lock
from pipeline.lake.storage import store
from pipeline.lake.story import describe, summary_lines
from pipeline.redisio import check as redischeck
from pipeline.settings import Settings

log = logging.getLogger("pipeline.lake.job")

SPARK_JOBS = frozenset({"archive", "archive-streams", "canonical", "maintain", "backfill"})
#: Jobs that write one stream's lake rows or Redis entries and so hold its archive lock.
LOCKED_JOBS = frozenset({"archive", "canonical", "trim"})


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def main(argv: Sequence[str]) -> int:
    try:
        args = parser().parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    # the [lake] extra, checked before any work: every job reads or writes Delta tables
    # (pyarrow, deltalake: also in [serve]), the Spark jobs run pyspark
    needs = ("pyarrow", "deltalake", *(("pyspark",) if args.job in SPARK_JOBS else ()))
    require(f"sluice lake {args.job}", "lake", needs)
    settings = Settings.load()
    check_args(args, settings)
    redischeck.check(settings.redis.url)
    with job_logging(settings, args.job) as (counter, debug_path):
        code = _main(args, settings, counter, debug_path)
    if code == EXIT_CANCELLED:
        # Stopped: leave now. The Connect client's exit hooks would otherwise
        # wait on release calls of the interrupted operations (seconds).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(
    args: argparse.Namespace, settings: Settings, counter: WarningCounter, debug_path: Path | None
) -> int:
    began = time.perf_counter()
    spark = (
        LazySpark(settings, app_name=f"sluice-lake-{args.job}") if args.job in SPARK_JOBS else None
    )
    where = f" on {spark.mode}" if spark is not None else ""
    log.info(
        "sluice lake %s%s%s",
        describe(args),
        where,
        f" (Spark log: {debug_path})" if debug_path else "",
    )
    stopper = Stopper(spark)
    restore = stopper.install()
    try:
        with ExitStack() as held:
            if args.job in LOCKED_JOBS:
                held.enter_context(stream_lock(settings, stopper, args.stream, args.job))
            result, ok = run(args, settings, spark, stopper.check, stopper, counter)
            stopper.check()
    except JobCancelled as exc:
        log.error("%s", exc)
        return EXIT_CANCELLED
    except SluiceError as exc:
        if stopper.stopping.is_set():
            return EXIT_CANCELLED  # the interrupt made the Spark work fail: that is the stop
        print(f"sluice lake: {exc}", file=sys.stderr, flush=True)
        return 1
    except store.store_errors() as exc:  # a lake read or write the job did not convert itself
        print(
            f"sluice lake: the lake at {settings.lake.uri} failed: {store.describe(exc)}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    finally:
        restore()
        if spark is not None:
            spark.close()
    seconds = time.perf_counter() - began
    doc = {"job": args.job, **_jsonable(result)}
    for line in summary_lines(args.job, doc, seconds):
        log.info("%s", line)
    doc["warnings"] = counter.count
    doc["job_seconds"] = round(seconds, 3)
    if spark is not None:
        doc["spark"] = spark.mode if spark.started else "not started"
    print(json.dumps(doc), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    from pipeline.cli import main as sluice_main

    code = sluice_main(["lake", *sys.argv[1:]])
    # The job's result is out and its logs are closed: leave without the
    # interpreter's teardown. Native thread pools (gRPC of the Connect client,
    # Arrow) torn down at exit have aborted a finished job ("terminate called
    # without an active exception", exit -6) after it printed its result.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
