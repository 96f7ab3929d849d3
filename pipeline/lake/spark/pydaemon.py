"""Spark's Python worker daemon with the lake's modules imported once.

Set as ``spark.python.daemon.module`` by :func:`pipeline.lake.spark.session.spark_conf`:
Spark forks every Python worker (data source planning and reads) from this
daemon, so each fork inherits pyarrow, redis-py and the ``redis-streams``
data source already imported instead of importing them again (about a
second per worker on a small machine).
"""

from __future__ import annotations

import pyarrow  # noqa: F401
import redis  # noqa: F401
from pyspark import daemon

import pipeline.lake.spark.source  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
