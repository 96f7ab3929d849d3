"""How a lake job's Spark errors become Sluice's: the cause a caller can act on."""

from __future__ import annotations

import pytest
from pyspark.errors import PythonException

from pipeline.errors import RedisUnavailable, SparkUnavailable
from pipeline.lake.write.jobs import run_spark

WORKER = "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"


def _raise(text: str) -> None:
    raise PythonException(message=text)


def test_a_tasks_redis_failure_is_redis_unavailable_naming_the_read() -> None:
    """A task that lost Redis mid-read (its master killed) says so; "Connection refused"
    in Redis' error is not the Spark Connect server going away."""
    text = WORKER + (
        "pipeline.errors.RedisUnavailable: redis unavailable while reading "
        "sluice:{c}:stream: Error 111 connecting to 127.0.0.1:7001. Connection refused.\n"
    )
    with pytest.raises(RedisUnavailable) as caught:
        run_spark("archive of 'c' [0, 10)", lambda: _raise(text))
    assert str(caught.value) == (
        "archive of 'c' [0, 10) failed: Redis is unavailable (redis unavailable while reading "
        "sluice:{c}:stream: Error 111 connecting to 127.0.0.1:7001. Connection refused.)"
    )


def test_a_lost_connect_server_is_still_spark_unavailable() -> None:
    with pytest.raises(SparkUnavailable, match="Spark Connect server went away"):
        run_spark("archive", lambda: _raise("failed to connect: Connection refused"))
