"""Benchmark of the lake: archive throughput per Spark mode, job overhead, session start, reads.

Metrics (JSON lines via Report), all in one run with their baselines:
- ``archive_entries_per_s`` (local one-JVM mode), ``archive_entries_per_s_connect``
  (a thin client of a ``sluice spark`` server) and ``archive_entries_per_s_standalone``
  (the Connect server in front of a standalone master with two workers on this
  machine): N entries (~300 B block payloads) of one stream archived by
  ``archive_interval``, measured after the session is up; baseline = raw paged
  ``XRANGE`` of the same entries in Python (redis-py), same run. ``writer`` says
  which writer ran (``arrow``: :mod:`pipeline.lake.write.arrowwrite`); ``stages`` holds
  the per-stage split (see ``ArchiveResult.stages``).
- ``archive_entries_per_s_s3``: local mode, the lake on versitygw (a real S3 server on
  this machine, :mod:`pipeline.local.s3`); baseline = ``archive_entries_per_s`` of the
  same run (local disk), so its ratio is S3 against local disk.
- ``archive_entries_per_s_spark_writer``: local mode with ``SLUICE_ARCHIVE_WRITER=spark``
  (the Spark writer), for comparison, same run.
- ``archive_entries_per_s_merge``: local mode, N/4 entries of a chain stream whose
  every block is in it twice (a repeated hash: what the Spark writer's MERGE settles;
  the Arrow writer's tasks write each hash's row once per range and the driver
  rewrites the files of a hash repeated across ranges, :mod:`pipeline.lake.write.arrowfix`;
  ``stages`` has ``fix`` when it did); baseline = raw ``XRANGE``, same run. With ``merge_spark`` in ``SLUICE_BENCH_MODES`` also
  ``archive_entries_per_s_merge_spark``: the same with ``SLUICE_ARCHIVE_WRITER=spark``.
- ``canonical_s``: canonical marking of one interval of 3,000 new blocks on top of
  the N archived (and marked) ones, what one ``sluice_archive`` run of a chain stream
  does; baseline = the read and walk alone (``chainwalk.pending``), same run.
- ``archive_job_overhead_s``: a whole ``sluice lake archive`` child process (what an
  Airflow task runs) against an interval with nothing in Redis, through Connect.
- ``spark_session_start_s``: the local one-JVM session with Delta (cached jars),
  baseline = a bare pyspark local session, each in a fresh process, same run.
- ``deltars_read_blocks_per_s`` / ``deltars_read_arrow_blocks_per_s``: the JVM-free reader.

N = 1,000,000 x ``SLUICE_BENCH_SCALE`` (default 1). ``SLUICE_BENCH_MODES`` picks
the parts (default ``session,local,merge,canonical,s3,connect,standalone``). Each archive runs in its own
child process (a Python process is a Spark Connect client or a local driver,
never both).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis  # noqa: E402
from common import Report  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402

STREAM = "bench"
WARM = "warm"
#: A chain stream whose every block is in it twice (the archive's MERGE path).
TWICE = "twice"
#: New blocks of the interval ``canonical_s`` marks.
TAIL = 3000
PAGE = 5000
ROOT = Path(__file__).resolve().parents[2]


def _block_hash(num: int) -> bytes:
    return hashlib.sha256(num.to_bytes(8, "big")).digest()


def _fill(
    client: redis.Redis, stream: str, n: int, *, start: int = 0, repeat: int = 1
) -> tuple[int, int]:
    """XADD n chained blocks (~300 B each) from num ``start``, each ``repeat`` times;
    returns the [start_ms, end_ms) interval holding them."""
    key = keys.stream(stream)
    parent = _block_hash(start - 1) if start else b"\x00" * 32
    pipe = client.pipeline(transaction=False)
    filler = os.urandom(200)
    first = None
    for num in range(start, start + n):
        h = _block_hash(num)
        block = Block(num=num, hash=h, parent=parent, updates={"state": filler})
        for _ in range(repeat):
            pipe.xadd(key, {ENTRY_FIELD: encode_block(block)})
        parent = h
        if num % 2000 == 1999:
            first = first or pipe.execute()[0]
    ids = pipe.execute()
    first = first or ids[0]
    last = client.xrevrange(key, "+", "-", count=1)[0][0]
    return int(first.split(b"-")[0]), int(last.split(b"-")[0]) + 1


def _raw_xrange(client: redis.Redis) -> tuple[int, float, list[Any]]:
    key = keys.stream(STREAM)
    start, count = "-", 0
    pages = []
    began = time.perf_counter()
    while True:
        page = client.xrange(key, start, "+", count=PAGE)
        count += len(page)
        pages.append(page)
        if len(page) < PAGE:
            break
        start = "(" + page[-1][0].decode()
    return count, time.perf_counter() - began, pages


def _raw_pages(url: str) -> tuple[float, list[Any]]:
    """Seconds of the archive's own paged read (raw ``XRANGE`` replies), and its pages."""
    from pipeline.lake.intake.redisread import raw_connect, read_raw_pages

    client = raw_connect(url)
    try:
        began = time.perf_counter()
        pages = list(read_raw_pages(client, keys.stream(STREAM), (0, 0), (2**63, 0), PAGE))
        return time.perf_counter() - began, pages
    finally:
        client.close()


def _decode(pages: list[Any]) -> float:
    """Seconds the archive's decode (block heads, Arrow pages) takes for ``pages`` in one process."""
    from pipeline.lake.intake.arrowpage import raw_to_batch
    from pipeline.lake.intake.blockhead import HeadReader

    heads = HeadReader()
    began = time.perf_counter()
    for page in pages:
        raw_to_batch(page, True, split=True, heads=heads)
    return time.perf_counter() - began


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# --- child processes --------------------------------------------------------------


def _child(args: list[str], env: dict[str, str], timeout: float = 3600) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        causes = [
            line[:300]
            for line in out.stderr.splitlines()
            if "Exception" in line or "Error:" in line
        ]
        raise RuntimeError(
            f"bench child {args} failed: {out.stderr[-3000:]}\ncauses:\n" + "\n".join(causes[:20])
        )
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def _child_session(kind: str) -> None:
    """Print the seconds a local session takes to answer its first query."""
    from pyspark.sql import SparkSession

    began = time.perf_counter()
    if kind == "bare":
        spark = (
            SparkSession.builder.master("local[*]")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
    else:
        from pipeline.lake.spark.session import build_session
        from pipeline.settings import Settings

        spark = build_session(Settings.load(spark_master="local[*]", spark_remote=""))
    spark.range(1).count()
    seconds = time.perf_counter() - began
    spark.stop()
    print(json.dumps({"seconds": seconds}))


def _child_archive(stream: str, start_ms: int, end_ms: int, warm: str) -> None:
    """Archive one interval with the session up first (untimed warm-up on ``warm``)."""
    from pipeline.lake.archive import archive_interval
    from pipeline.lake.spark.session import build_session, close_session
    from pipeline.settings import Settings

    settings = Settings.load()
    spark = build_session(settings, app_name="sluice-bench-archive")
    try:
        if warm:  # the first job of a session pays Python worker and Delta warm-up
            w_start, w_end = (int(x) for x in warm.split(":"))
            archive_interval(spark, settings, WARM, w_start, w_end)
        began = time.perf_counter()
        result = archive_interval(spark, settings, stream, start_ms, end_ms)
        seconds = time.perf_counter() - began
    finally:
        close_session(spark)
    print(json.dumps({"seconds": seconds, "entries": result.entries, "stages": result.stages}))


def _child_canonical(stream: str, start_ms: int, end_ms: int) -> None:
    """Mark the lake's chain (untimed), archive one more interval, time its canonical marking."""
    from pipeline.lake.archive import archive_interval
    from pipeline.lake.canonical import mark_canonical, pending
    from pipeline.lake.spark.session import build_session, close_session
    from pipeline.settings import Settings

    settings = Settings.load()
    spark = build_session(settings, app_name="sluice-bench-canonical")
    try:
        mark_canonical(spark, settings, stream)
        archive_interval(spark, settings, stream, start_ms, end_ms)
        began = time.perf_counter()
        pending(settings.lake, stream)
        walk_s = time.perf_counter() - began
        began = time.perf_counter()
        result = mark_canonical(spark, settings, stream)
        seconds = time.perf_counter() - began
    finally:
        close_session(spark)
    print(json.dumps({"seconds": seconds, "walk_s": walk_s, "marked": result.marked}))


# --- the standalone cluster ---------------------------------------------------------


def _standalone(tmp: Path, workers: int = 2) -> tuple[str, list[subprocess.Popen[bytes]]]:
    from pipeline.runtime.ports import free_port
    from tests.e2e.test_standalone_cluster import _cluster_env, _start, _wait_for, spark_home

    env = _cluster_env(tmp)
    for sub in ("local", "work"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    procs = [
        _start(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui_port)],
            env, tmp / "master.log",
        )
    ]  # fmt: skip
    _wait_for(ui_port, lambda s: s.get("status") == "ALIVE", "master ALIVE", procs)
    url = f"spark://127.0.0.1:{port}"
    for i in range(workers):
        procs.append(
            _start(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                 "--work-dir", str(tmp / "work")],
                env, tmp / f"worker{i}.log",
            )
        )  # fmt: skip
    _wait_for(ui_port, lambda s: s.get("aliveworkers", 0) >= workers, "workers alive", procs)
    return url, procs


def main() -> int:
    if sys.argv[1:2] == ["--child-session"]:
        _child_session(sys.argv[2])
        return 0
    if sys.argv[1:2] == ["--child-canonical"]:
        _child_canonical(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    if sys.argv[1:2] == ["--child-archive"]:
        _child_archive(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return 0
    from pipeline.lake.spark.server import ConnectServer
    from pipeline.runtime.ports import free_port
    from pipeline.settings import Settings

    scale = float(os.environ.get("SLUICE_BENCH_SCALE", "1"))
    n = max(1000, int(1_000_000 * scale))
    modes = os.environ.get(
        "SLUICE_BENCH_MODES", "session,local,merge,canonical,s3,connect,standalone"
    ).split(",")
    cores = os.cpu_count() or 2
    report = Report("archive")
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        server = LocalRedis(tmp / "redis").start()
        try:
            client = redis.Redis.from_url(server.url)
            w_start, w_end = _fill(client, WARM, 2000)
            start_ms, end_ms = _fill(client, STREAM, n)
            twice_n = n // 8
            t_start, t_end = _fill(client, TWICE, twice_n, repeat=2)
            while int(client.time()[0]) * 1000 <= t_end:  # the intervals must be closed
                time.sleep(0.05)
            count, raw_s, pages = _raw_xrange(client)
            assert count == n, (count, n)
            raw_rate = n / raw_s
            del pages
            read_s, pages = _raw_pages(server.url)
            decode_s = _decode(pages)
            del pages
            # The chain goes on after the measured interval: canonical_s's next run.
            tail_start, tail_end = _fill(client, STREAM, TAIL, start=n)
            while int(client.time()[0]) * 1000 <= tail_end:
                time.sleep(0.05)
            # The per-entry work outside Spark, one process: the archive's read (paged XRANGE,
            # raw replies) and decode; xrange_us is the baseline's (redis-py's dict per entry).
            report.emit("archive_read_decode_us_per_entry", (read_s + decode_s) / n * 1e6,
                        read_us=round(read_s / n * 1e6, 2), decode_us=round(decode_s / n * 1e6, 2),
                        xrange_us=round(raw_s / n * 1e6, 2), load=_load())  # fmt: skip

            base_env = {
                "SLUICE_CONFIG": os.devnull,
                "SLUICE_REDIS_URL": server.url,
                "SLUICE_STREAMS": f"{STREAM},{WARM},{TWICE}",
                "SLUICE_CHAIN_STREAMS": f"{STREAM},{WARM},{TWICE}",
                "SLUICE_SPARK_MASTER": "local[*]",
                "SLUICE_ARCHIVE_PARTITIONS": str(cores),
                "SLUICE_SPARK_SHUFFLE_PARTITIONS": str(cores),
                "SLUICE_VAR_DIR": str(tmp / "var"),
            }
            if "session" in modes:
                bare = min(
                    _child(["--child-session", "bare"], base_env)["seconds"] for _ in range(2)
                )
                ours = min(
                    _child(["--child-session", "sluice"], base_env)["seconds"] for _ in range(2)
                )
                report.emit("spark_session_start_s", ours, bare)

            warm = f"{w_start}:{w_end}"
            archive_args = ["--child-archive", STREAM, str(start_ms), str(end_ms), warm]

            rates: dict[str, float] = {}

            def archive(
                mode: str, metric: str, remote: str = "", writer: str = "arrow",
                lake: dict[str, str] | None = None, baseline: float | None = None,
                args: list[str] = archive_args, count: int = n, expect: str = "",
            ) -> None:  # fmt: skip
                env = {**base_env, "SLUICE_LAKE_URI": str(tmp / f"lake-{mode}-{writer}"),
                       "SLUICE_SPARK_REMOTE": remote, "SLUICE_ARCHIVE_WRITER": writer,
                       **(lake or {})}  # fmt: skip
                load = _load()
                doc = _child(args, env)
                assert doc["entries"] == count, doc
                stages = doc["stages"]
                used = (
                    "merge" if "merge_entries" in stages
                    else "arrow" if "commit_entries" in stages else "spark"
                )  # fmt: skip
                assert used == (expect or writer), doc
                rates[metric] = count / doc["seconds"]
                report.emit(metric, rates[metric], baseline or raw_rate, entries=count, mode=mode,
                            writer=used, archive_s=round(doc["seconds"], 2),
                            xrange_s=round(raw_s, 2), stages=doc["stages"],
                            load=[load, _load()])  # fmt: skip

            if "local" in modes:
                archive("local", "archive_entries_per_s")
                try:
                    archive("local", "archive_entries_per_s_spark_writer", writer="spark")
                except RuntimeError as exc:  # reported, and the other modes still run
                    cause = str(exc).rsplit("causes:\n", 1)[-1].splitlines()
                    report.emit("archive_entries_per_s_spark_writer", 0.0, raw_rate,
                                writer="spark", error=(cause or ["?"])[-1][:300])  # fmt: skip
            if "merge" in modes:
                twice_args = ["--child-archive", TWICE, str(t_start), str(t_end), warm]
                archive("merge", "archive_entries_per_s_merge", count=2 * twice_n, expect="arrow",
                        args=twice_args)  # fmt: skip
                if "merge_spark" in modes:  # the Spark writer on the same path, for comparison
                    archive("merge", "archive_entries_per_s_merge_spark", count=2 * twice_n,
                            writer="spark", args=twice_args)  # fmt: skip
            if "canonical" in modes and "local" in modes:
                import shutil

                # on a copy: the reads below measure the archived lake as it was
                shutil.copytree(tmp / "lake-local-arrow", tmp / "lake-canonical")
                doc = _child(
                    ["--child-canonical", STREAM, str(tail_start), str(tail_end)],
                    {**base_env, "SLUICE_LAKE_URI": str(tmp / "lake-canonical")},
                )
                report.emit("canonical_s", doc["seconds"], doc["walk_s"], marked=doc["marked"],
                            blocks=n + TAIL, load=_load())  # fmt: skip
            if "s3" in modes:
                # The same archive onto versitygw (a real S3 server on this machine), against
                # the local-disk figure of this run (or raw XRANGE when "local" did not run).
                from pipeline.local.s3 import LocalStore

                with LocalStore(tmp / "s3") as store:
                    store.create_bucket("lake")
                    lake = {"SLUICE_" + k.upper(): str(v).lower() if isinstance(v, bool) else str(v)
                            for k, v in store.lake_settings().items()}  # fmt: skip
                    lake["SLUICE_LAKE_URI"] = "s3://lake/bench"
                    archive("s3", "archive_entries_per_s_s3", lake=lake,
                            baseline=rates.get("archive_entries_per_s"))  # fmt: skip
            settings = Settings.load(config_path=os.devnull, spark_master="local[*]")
            if "connect" in modes:
                with ConnectServer(
                    settings, port=free_port(), log_path=tmp / "connect.log"
                ) as connect:
                    archive("connect", "archive_entries_per_s_connect", connect.url)
                    # A whole job child (what a task runs) for an interval with nothing in Redis.
                    env = {**os.environ, **base_env,
                           "SLUICE_LAKE_URI": str(tmp / "lake-connect-arrow"),
                           "SLUICE_SPARK_REMOTE": connect.url}  # fmt: skip
                    empty = [str(end_ms + 1), str(end_ms + 2)]
                    began = time.perf_counter()
                    subprocess.run(
                        [sys.executable, "-m", "pipeline.lake.cli", "archive", "--stream", STREAM,
                         "--start-ms", empty[0], "--end-ms", empty[1]],
                        env=env, cwd=ROOT, check=True, capture_output=True,
                    )  # fmt: skip
                    report.emit("archive_job_overhead_s", time.perf_counter() - began)
            if "standalone" in modes:
                from tests.e2e.test_standalone_cluster import _stop

                url, procs = _standalone(tmp / "cluster")
                try:
                    cluster = settings.replace(spark_master=url)
                    with ConnectServer(
                        cluster, port=free_port(), log_path=tmp / "connect-cluster.log"
                    ) as connect:
                        archive("standalone", "archive_entries_per_s_standalone", connect.url)
                finally:
                    for proc in reversed(procs):
                        _stop(proc)

            if "local" in modes:
                _reads(report, str(tmp / "lake-local-arrow"), n)
        finally:
            server.stop()
    report.save()
    return 0


def _reads(report: Report, lake_uri: str, n: int) -> None:
    """The JVM-free reader over the local mode's lake (whole chain marked canonical by delta-rs)."""
    from deltalake import DeltaTable

    from pipeline.lake.storage.reader import LakeReader

    DeltaTable(f"{lake_uri}/blocks").update(
        updates={"canonical": "true"}, predicate=f"stream = '{STREAM}'"
    )
    reader = LakeReader(lake_uri)
    for _ in reader.iter_canonical_arrow(STREAM, 0):  # warm the file cache, untimed
        pass
    began = time.perf_counter()
    rows = sum(len(batch) for batch in reader.iter_canonical(STREAM, 0))
    read_s = time.perf_counter() - began
    assert rows == n, (rows, n)
    began = time.perf_counter()
    arrow_rows = sum(t.num_rows for t in reader.iter_canonical_arrow(STREAM, 0))
    arrow_s = time.perf_counter() - began
    assert arrow_rows == n
    report.emit("deltars_read_blocks_per_s", n / read_s, blocks=n, read_s=round(read_s, 2))
    report.emit("deltars_read_arrow_blocks_per_s", n / arrow_s, blocks=n)


if __name__ == "__main__":
    sys.exit(main())
