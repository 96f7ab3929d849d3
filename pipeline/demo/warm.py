"""Warm a fresh Spark Connect server with one small Delta write, merge and read.

``python -m pipeline.demo.warm sc://host:port <scratch table dir>``

The first Delta write on a cold server costs a minute or more on a busy
2-core machine (class loading, JIT, Delta's first commit). The demo runs
this while Airflow is still starting, so the first ``sluice_archive`` run
does not pay it. Run as a child process: a process is either a Connect
client or a local driver, and the demo's own process is neither.
"""

from __future__ import annotations

import sys
import time

from pipeline.lake.spark.session import close_session, connect_session


def main(argv: list[str]) -> int:
    url, path = argv
    started = time.monotonic()
    spark = connect_session(url)
    try:
        frame = spark.range(64).selectExpr("id", "cast(id as string) as value")
        frame.write.format("delta").mode("overwrite").save(path)
        spark.sql(
            f"MERGE INTO delta.`{path}` t USING (SELECT id + 32 AS id, 'x' AS value "
            f"FROM range(64)) s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *"
        )
        rows = spark.read.format("delta").load(path).count()
    finally:
        close_session(spark)
    sys.stdout.write(f"warm: {rows} rows in {time.monotonic() - started:.1f}s\n")
    return 0 if rows == 96 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
