"""Benchmark of the archive through Airflow: one task's cost next to the bare job, and streams per job.

Metrics (JSON lines via Report), each in one run with its baseline:
- ``airflow_archive_task_s``: the ``archive_streams`` task of ``sluice_archive``
  (the one that runs the lake job) for one 5-minute interval of a 10 blocks/s
  chain stream (3,000 blocks of ~300 B), run by ``airflow dags test`` against
  a ``sluice spark`` Connect server (the task instance's duration from
  Airflow's database: child start, Connect session, archive, result).
  Baseline: the same archive as one ``sluice lake archive`` child
  (``python -m pipeline.lake.cli archive``) against the same server, into its
  own lake. Goal: <= 10 s. ``stream_task_s`` is the stream's mapped
  ``archive`` task (its result, taken from the shared job), ``dags_test_s``
  the whole ``dags test`` (all tasks, parsing, DB).
- ``archive_streams_one_job_s``: ``SLUICE_BENCH_STREAMS`` (default 4) streams
  of one interval archived by one ``sluice lake archive-streams`` child (what
  the DAG runs now); baseline: the same archives as one ``sluice lake
  archive`` child per stream, in sequence (what a task per stream ran before).
- ``airflow_archive_streams_task_s``: the ``archive_streams`` task of a
  ``dags test`` run with those streams (``SLUICE_STREAMS``); baseline the same
  child-per-stream total. ``stream_tasks_s`` lists the mapped tasks' durations.

- ``airflow_run_100_streams_s``: one whole ``sluice_archive`` run through
  ``airflow dags test`` of ``SLUICE_BENCH_RUN_STREAMS`` (default 100) streams,
  resolved from patterns at run start: one chain stream (20 blocks/s) and the
  rest plain streams at 20 messages/s (~200 B each), one 5-minute interval each
  (6,000 entries a stream). Baseline: the same run with the chain stream alone
  (the fixed cost of a run). ``tasks_s`` sums the task instances' durations per
  task. Goal: <= 60 s. ``SLUICE_BENCH_ONLY=run`` runs this figure alone. ``xrange``: the
  run's ``XRANGE`` calls and Redis' time in them (task-range probes and the tasks' pages).
- ``airflow_run_100_streams_sched_s`` (``SLUICE_BENCH_ONLY=sched`` only): the same run through
  a real ``airflow scheduler`` and ``api-server`` on PostgreSQL (:mod:`airflow_sched`);
  baseline the chain stream's run alone in the same system.
- ``airflow_run_100_streams_celery_s``, ``airflow_run_1000_streams_s``
  (``SLUICE_BENCH_ONLY=celery`` only): runs through a real scheduler and api-server
  on PostgreSQL with docs/operations/celery.md's setup, two ``airflow celery
  worker`` of concurrency 4 (``SLUICE_BENCH_CELERY_CONCURRENCY``;
  :mod:`airflow_celery`), warmed by an untimed run of an empty interval: the chain
  stream (20 blocks/s) alone (the baseline of both), then with 99 plain streams at
  20 messages/s (goal 30 s), then with 999 at 2 messages/s (goal 90 s), one
  5-minute interval each (a run's plain streams are deleted after it). ``tasks``
  sums durations per task id; ``load`` is the 1-minute load before and after.

The Connect server is warmed up first (one untimed archive), as a deployment's
long-lived server is.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis  # noqa: E402
from common import Report  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block  # noqa: E402
from pipeline.demo import airflowdb  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STREAM = "chain:bench-af"
WARM = "chain:bench-warm"
RATE = 10  # blocks per second
INTERVAL = timedelta(minutes=5)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _fill(client: redis.Redis, stream: str, start_ms: int, n: int, step_ms: int) -> None:
    """XADD n chained blocks (~300 B each), one every ``step_ms`` from ``start_ms``."""
    parent = b"\x00" * 32
    filler = os.urandom(200)
    pipe = client.pipeline(transaction=False)
    for num in range(n):
        h = hashlib.sha256(stream.encode() + num.to_bytes(8, "big")).digest()
        block = Block(num=num, hash=h, parent=parent, updates={"state": filler})
        pipe.xadd(
            keys.stream(stream),
            {ENTRY_FIELD: encode_block(block)},
            id=f"{start_ms + num * step_ms}-0",
        )
        parent = h
        if num % 2000 == 1999:
            pipe.execute()
    pipe.execute()


def _cli(env: dict[str, str], job: str, *args: str) -> tuple[float, dict[str, Any]]:
    """One ``sluice lake JOB`` child, as a task runs it; (wall seconds, its result)."""
    began = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.lake.cli", job, *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - began
    if out.returncode != 0:
        raise RuntimeError(f"sluice lake {job} failed: {out.stderr[-3000:]}")
    return seconds, json.loads(out.stdout.strip().splitlines()[-1])


def _job(
    env: dict[str, str], stream: str, start_ms: int, end_ms: int
) -> tuple[float, dict[str, Any]]:
    """One ``sluice lake archive`` child (one stream)."""
    return _cli(env, "archive", "--stream", stream, "--start-ms", str(start_ms), "--end-ms",
                str(end_ms))  # fmt: skip


def _one_job(env: dict[str, str], streams: list[str], start_ms: int, end_ms: int) -> float:
    """One ``sluice lake archive-streams`` child for every stream; its wall seconds."""
    args = [a for stream in streams for a in ("--stream", stream)]
    seconds, result = _cli(
        env, "archive-streams", *args, "--start-ms", str(start_ms), "--end-ms", str(end_ms)
    )
    assert result["failed"] == [] and list(result["streams"]) == streams, result
    return seconds


def _fill_plain(client: redis.Redis, stream: str, start_ms: int, n: int, step_ms: int) -> None:
    """XADD n plain entries (~200 B of fields), one every ``step_ms`` from ``start_ms``."""
    pipe = client.pipeline(transaction=False)
    body = os.urandom(90).hex()
    for i in range(n):
        pipe.xadd(
            keys.stream(stream), {"kind": "event", "body": body}, id=f"{start_ms + i * step_ms}-0"
        )
        if i % 3000 == 2999:
            pipe.execute()
    pipe.execute()


def _tasks_s(home: Path) -> dict[str, Any]:
    """Per task id: (count, summed duration) of the run's task instances."""
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute(
            "select task_id, count(*), sum(duration), group_concat(distinct state) "
            "from task_instance group by task_id"
        ).fetchall()
    return {t: {"n": n, "s": round(float(d or 0), 2), "state": st} for t, n, d, st in rows}


def _run_streams(
    tmp: Path, env: dict[str, str], end: datetime, start_ms: int, n_streams: int
) -> tuple[float, dict[str, Any]]:
    """One ``dags test`` run of ``sluice_archive`` over ``n_streams`` streams (the chain one
    first); (wall seconds, details)."""
    rate = 20
    n = int(INTERVAL.total_seconds()) * rate
    url = env["SLUICE_REDIS_URL"]
    client = redis.Redis.from_url(url)
    client.flushall()
    chain = "chain:run"
    _fill(client, chain, start_ms, n, 1000 // rate)
    for i in range(n_streams - 1):
        _fill_plain(client, f"events:s{i:03d}", start_ms, n, 1000 // rate)
    client.close()
    home = tmp / f"airflow-run-{n_streams}"
    home.mkdir()
    af_env = _airflow_env(
        home, {**env, "SLUICE_LAKE_URI": str(tmp / f"lake-run-{n_streams}"),
               "SLUICE_STREAMS": "chain:*,events:*", "SLUICE_CHAIN_STREAMS": "chain:*"},
    )  # fmt: skip
    _airflow(af_env, "db", "migrate")
    load = _load()
    client = redis.Redis.from_url(url)
    xrange = _xrange_stats(client)
    seconds = _airflow(af_env, "dags", "test", "sluice_archive", end.isoformat())
    xrange = {k: v - xrange[k] for k, v in _xrange_stats(client).items()}
    client.close()
    tasks = _tasks_s(home)
    failed = {t: v for t, v in tasks.items() if v["state"] not in ("success", "skipped")}
    assert not failed, failed
    return seconds, {
        "load": [load, _load()], "tasks_s": tasks, "entries_per_stream": n, "xrange": xrange
    }  # fmt: skip


def _xrange_stats(client: redis.Redis) -> dict[str, int]:
    """Redis' ``XRANGE`` calls and their server time in us so far (the driver's task-range
    probes, ``redisread.balanced_ranges``, are up to 256 of them per stream interval)."""
    stats = client.info("commandstats").get("cmdstat_xrange") or {}
    return {"calls": int(stats.get("calls", 0)), "usec": int(stats.get("usec", 0))}


def _run_sched(
    tmp: Path, env: dict[str, str], end: datetime, start_ms: int, n_streams: int, report: Report
) -> None:
    """``airflow_run_100_streams_sched_s`` (:mod:`airflow_sched`): the chain stream's run alone,
    then the run of every stream, each triggered in one real scheduler and api-server."""
    from airflow_sched import Scheduler

    rate = 20
    n = int(INTERVAL.total_seconds()) * rate
    step = 1000 // rate
    client = redis.Redis.from_url(env["SLUICE_REDIS_URL"])
    client.flushall()
    # the chain over two intervals: the baseline run's, then the timed run's
    _fill(client, "chain:run", start_ms - n * step, 2 * n, step)
    af_env = {**env, "SLUICE_LAKE_URI": str(tmp / "lake-sched"),
              "SLUICE_STREAMS": "chain:*,events:*", "SLUICE_CHAIN_STREAMS": "chain:*"}  # fmt: skip
    with Scheduler(tmp, af_env) as system:
        one_s, one = system.run("bench-one", end - 2 * INTERVAL, end - INTERVAL)
        for i in range(n_streams - 1):
            _fill_plain(client, f"events:s{i:03d}", start_ms, n, step)
        many_s, many = system.run("bench-many", end - INTERVAL, end)
    client.close()
    report.emit(
        "airflow_run_100_streams_sched_s", many_s, one_s, streams=n_streams, goal_s=60.0,
        parallelism=system.env["AIRFLOW__CORE__PARALLELISM"], **many, baseline_stats=one,
        entries_per_stream=n,
    )  # fmt: skip


#: The Celery runs after the baseline: (metric, streams, plain streams' messages/s, goal s).
CELERY_RUNS = (
    ("airflow_run_100_streams_celery_s", 100, 20, 30.0),
    ("airflow_run_1000_streams_s", 1000, 2, 90.0),
)


def _run_celery(
    tmp: Path, env: dict[str, str], server: LocalRedis, end: datetime, report: Report
) -> None:
    """:data:`CELERY_RUNS` and their baseline (the chain stream's run alone) in one
    :class:`airflow_celery.CelerySystem`, each run over the next 5-minute interval."""
    from airflow_celery import WORKERS, CelerySystem

    from tests.integration.airflow_view.deployment import fresh_db

    n = int(INTERVAL.total_seconds()) * 20
    first = end - len(CELERY_RUNS) * INTERVAL - INTERVAL
    client = redis.Redis.from_url(env["SLUICE_REDIS_URL"])
    client.flushall()
    # the chain over every run's interval: the baseline's first
    _fill(client, "chain:run", int(first.timestamp() * 1000), (len(CELERY_RUNS) + 1) * n, 50)
    broker, broker_client = fresh_db(server, 13)
    broker_client.close()
    af_env = {**env, "SLUICE_LAKE_URI": str(tmp / "lake-celery"),
              "SLUICE_STREAMS": "chain:*,events:*", "SLUICE_CHAIN_STREAMS": "chain:*"}  # fmt: skip
    with CelerySystem(tmp, af_env, broker) as system:
        # untimed: each worker's first tasks pay its imports (an empty interval: no Spark)
        system.run("bench-warm", first - INTERVAL, first)
        one_s, one = system.run("bench-one", first, first + INTERVAL)
        for i, (metric, n_streams, rate, goal_s) in enumerate(CELERY_RUNS, start=1):
            lo = first + i * INTERVAL
            names = [f"events:r{n_streams}-{j:04d}" for j in range(n_streams - 1)]
            per = int(INTERVAL.total_seconds()) * rate
            began = time.perf_counter()
            for name in names:
                _fill_plain(client, name, int(lo.timestamp() * 1000), per, 1000 // rate)
            fill_s = round(time.perf_counter() - began, 1)
            seconds, stats = system.run(f"bench-{n_streams}", lo, lo + INTERVAL)
            report.emit(
                metric, seconds, one_s, streams=n_streams, goal_s=goal_s, plain_msgs_per_s=rate,
                chain_blocks_per_s=20, entries=n + (n_streams - 1) * per, workers=len(WORKERS),
                concurrency=system.concurrency, parallelism=system.env["AIRFLOW__CORE__PARALLELISM"],
                **stats, loadavg=[round(x, 2) for x in os.getloadavg()], fill_s=fill_s,
                baseline_stats=one,
            )  # fmt: skip
            client.delete(*(keys.stream(name) for name in names))
    client.close()


def _airflow_env(home: Path, env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SLUICE_"))}
    return {
        **base,
        **env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        **airflowdb.ENV,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }


def _airflow(env: dict[str, str], *args: str) -> float:
    began = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "airflow", *args],
        env=env, cwd=env["AIRFLOW_HOME"], capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} failed: {(out.stdout + out.stderr)[-4000:]}")
    return time.perf_counter() - began


def _task_seconds(home: Path, task_id: str) -> list[float]:
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute(
            "select duration, state from task_instance where task_id = ?", (task_id,)
        ).fetchall()
    assert rows and all(state == "success" for _, state in rows), rows
    return [float(d) for d, _ in rows]


def main() -> int:
    from pipeline.lake.spark.server import ConnectServer
    from pipeline.runtime.ports import free_port
    from pipeline.settings import Settings

    n_streams = int(os.environ.get("SLUICE_BENCH_STREAMS", "4"))
    run_streams = int(os.environ.get("SLUICE_BENCH_RUN_STREAMS", "100"))
    only = os.environ.get("SLUICE_BENCH_ONLY", "")
    report = Report("airflow")
    # The interval: a 5-minute one on the grid, an hour ago (closed, inside no retention).
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    end -= timedelta(minutes=end.minute % 5)
    start = end - INTERVAL
    start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    n = int(INTERVAL.total_seconds()) * RATE
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        server = LocalRedis(tmp / "redis").start()
        try:
            client = redis.Redis.from_url(server.url)
            _fill(client, STREAM, start_ms, n, 1000 // RATE)
            _fill(client, WARM, start_ms, 200, 1000)
            others = [f"chain:bench-s{i}" for i in range(n_streams)]
            for stream in others:
                _fill(client, stream, start_ms, n // 10, 1000)  # 1 block/s each
            client.close()
            settings = Settings.load(config_path=os.devnull, spark_master="local[*]")
            with ConnectServer(settings, port=free_port(), log_path=tmp / "connect.log") as connect:
                env = {
                    **{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
                    "SLUICE_CONFIG": os.devnull,
                    "SLUICE_REDIS_URL": server.url,
                    "SLUICE_STREAMS": ",".join([STREAM, WARM, *others]),
                    "SLUICE_CHAIN_STREAMS": ",".join([STREAM, WARM, *others]),
                    "SLUICE_SPARK_REMOTE": connect.url,
                    "SLUICE_VAR_DIR": str(tmp / "var"),
                    "SLUICE_HOT_RETENTION_S": str(30 * 86400),
                    "SLUICE_LAKE_TASK_RETRIES": "0",
                }
                # Warm the server (Python workers, Delta classes), untimed.
                _job({**env, "SLUICE_LAKE_URI": str(tmp / "lake-warm")}, WARM, start_ms, end_ms)

                if only == "celery":
                    _run_celery(tmp, env, server, end, report)
                    report.save()
                    return 0
                if only == "sched":
                    _run_sched(tmp, env, end, start_ms, run_streams, report)
                    report.save()
                    return 0
                if only in ("", "run"):
                    one_s, one = _run_streams(tmp, env, end, start_ms, 1)
                    many_s, many = _run_streams(tmp, env, end, start_ms, run_streams)
                    report.emit(
                        "airflow_run_100_streams_s", many_s, one_s, streams=run_streams,
                        goal_s=60.0, **many, baseline_tasks_s=one["tasks_s"],
                        baseline_load=one["load"],
                    )  # fmt: skip
                    if only == "run":
                        report.save()
                        return 0
                    client = redis.Redis.from_url(server.url)
                    client.flushall()
                    _fill(client, STREAM, start_ms, n, 1000 // RATE)
                    for stream in others:
                        _fill(client, stream, start_ms, n // 10, 1000)
                    client.close()

                load = _load()
                direct_s, result = _job(
                    {**env, "SLUICE_LAKE_URI": str(tmp / "lake-direct")}, STREAM, start_ms, end_ms
                )
                assert result["entries"] == n, result

                home = tmp / "airflow"
                home.mkdir()
                af_env = _airflow_env(
                    home, {**env, "SLUICE_LAKE_URI": str(tmp / "lake-airflow"), "SLUICE_STREAMS": STREAM,
                           "SLUICE_CHAIN_STREAMS": STREAM},
                )  # fmt: skip
                _airflow(af_env, "db", "migrate")
                dags_test_s = _airflow(af_env, "dags", "test", "sluice_archive", end.isoformat())
                (task_s,) = _task_seconds(home, "archive_streams")
                (stream_task_s,) = _task_seconds(home, "archive")
                report.emit(
                    "airflow_archive_task_s", task_s, direct_s, entries=n, goal_s=10.0,
                    job_s=result.get("job_seconds"), stages=result.get("stages"),
                    stream_task_s=round(stream_task_s, 2), dags_test_s=round(dags_test_s, 2),
                    canonical_task_s=round(_task_seconds(home, "canonical")[0], 2),
                    load=[load, _load()],
                )  # fmt: skip

                # Several streams: a job child per stream (the old mapped tasks) vs one job.
                load = _load()
                per_task = 0.0
                for stream in others:
                    seconds, _ = _job(
                        {**env, "SLUICE_LAKE_URI": str(tmp / "lake-streams-a")},
                        stream, start_ms, end_ms,
                    )  # fmt: skip
                    per_task += seconds
                one_s = _one_job(
                    {**env, "SLUICE_LAKE_URI": str(tmp / "lake-streams-b")},
                    others,
                    start_ms,
                    end_ms,
                )
                report.emit(
                    "archive_streams_one_job_s", one_s, per_task, streams=n_streams,
                    entries_per_stream=n // 10, load=[load, _load()],
                )  # fmt: skip

                # The same streams through the DAG: one archive_streams task, light mapped ones.
                load = _load()
                home = tmp / "airflow-streams"
                home.mkdir()
                af_env = _airflow_env(
                    home, {**env, "SLUICE_LAKE_URI": str(tmp / "lake-streams-c"),
                           "SLUICE_STREAMS": ",".join(others),
                           "SLUICE_CHAIN_STREAMS": ",".join(others)},
                )  # fmt: skip
                _airflow(af_env, "db", "migrate")
                dags_test_s = _airflow(af_env, "dags", "test", "sluice_archive", end.isoformat())
                (shared_s,) = _task_seconds(home, "archive_streams")
                report.emit(
                    "airflow_archive_streams_task_s", shared_s, per_task, streams=n_streams,
                    stream_tasks_s=[round(x, 2) for x in _task_seconds(home, "archive")],
                    dags_test_s=round(dags_test_s, 2), load=[load, _load()],
                )  # fmt: skip
        finally:
            server.stop()
    report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
