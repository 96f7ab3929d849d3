"""Benchmark of the lake: archive throughput, Spark session start, JVM-free read throughput.

Metrics (JSON lines via Report):
- ``archive_entries_per_s``: N entries (~300 B block payloads) of one stream archived
  by ``archive_interval`` on local Spark, session start excluded; baseline = raw
  paged ``XRANGE`` of the same entries in Python, same run.
- ``spark_session_start_s``: building the SparkSession with Delta.
- ``deltars_read_blocks_per_s``: ``LakeReader.iter_canonical`` returning N canonical
  blocks as ``BlockRow`` objects (``deltars_read_arrow_blocks_per_s``: the arrow path).

N = 1,000,000 x ``SLUICE_BENCH_SCALE`` (default 1). Spark master from
``SLUICE_SPARK_MASTER`` (default ``local[*]``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis  # noqa: E402
from common import Report  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.chain.batch import ENTRY_FIELD, Block, encode_block  # noqa: E402
from pipeline.localredis import LocalRedis  # noqa: E402

STREAM = "bench"
PAGE = 5000


def _fill(client: redis.Redis, n: int) -> tuple[int, int]:
    """XADD n chained blocks (~300 B each); returns the [start_ms, end_ms) interval holding them."""
    key = keys.stream(STREAM)
    parent = b"\x00" * 32
    pipe = client.pipeline(transaction=False)
    filler = os.urandom(200)
    for num in range(n):
        h = hashlib.sha256(num.to_bytes(8, "big")).digest()
        block = Block(num=num, hash=h, parent=parent, updates={"state": filler})
        pipe.xadd(key, {ENTRY_FIELD: encode_block(block)})
        parent = h
        if num % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    first = client.xrange(key, "-", "+", count=1)[0][0]
    last = client.xrevrange(key, "+", "-", count=1)[0][0]
    return int(first.split(b"-")[0]), int(last.split(b"-")[0]) + 1


def _raw_xrange(client: redis.Redis) -> tuple[int, float]:
    key = keys.stream(STREAM)
    start, count = "-", 0
    began = time.perf_counter()
    while True:
        page = client.xrange(key, start, "+", count=PAGE)
        count += len(page)
        if len(page) < PAGE:
            break
        start = "(" + page[-1][0].decode()
    return count, time.perf_counter() - began


def main() -> int:
    scale = float(os.environ.get("SLUICE_BENCH_SCALE", "1"))
    n = max(1000, int(1_000_000 * scale))
    report = Report("archive")
    with tempfile.TemporaryDirectory() as tmp:
        server = LocalRedis(Path(tmp) / "redis").start()
        spark = None
        try:
            client = redis.Redis.from_url(server.url)
            start_ms, end_ms = _fill(client, n)
            while int(client.time()[0]) * 1000 <= end_ms:  # the interval must be closed
                time.sleep(0.05)

            from pipeline.lake.session import build_session
            from pipeline.settings import Settings

            settings = Settings.load(
                redis_url=server.url,
                lake_uri=str(Path(tmp) / "lake"),
                streams=(STREAM,),
                chain_streams=(STREAM,),
                spark_master=os.environ.get("SLUICE_SPARK_MASTER", "local[*]"),
            )
            began = time.perf_counter()
            spark = build_session(settings, app_name="sluice-bench-archive")
            spark.range(1).count()
            session_s = time.perf_counter() - began

            count, raw_s = _raw_xrange(client)
            assert count == n, (count, n)

            from pipeline.lake.archive import archive_interval

            began = time.perf_counter()
            result = archive_interval(spark, settings, STREAM, start_ms, end_ms)
            archive_s = time.perf_counter() - began
            assert (result.entries, result.blocks) == (n, n), result
            report.emit("archive_entries_per_s", n / archive_s, n / raw_s, entries=n,
                        archive_s=round(archive_s, 2), xrange_s=round(raw_s, 2))  # fmt: skip
            report.emit("spark_session_start_s", session_s)

            # Setup for the read figure (not timed): mark the whole chain canonical.
            from pipeline.lake.jobs import table_sql

            spark.sql(
                f"UPDATE {table_sql(settings.lake, 'blocks')} SET canonical = true "
                f"WHERE stream = '{STREAM}'"
            )
            from pipeline.lake.reader import LakeReader

            reader = LakeReader(settings.lake.uri)
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
        finally:
            if spark is not None:
                spark.stop()
            server.stop()
    report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
