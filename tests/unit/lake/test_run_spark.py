"""How a lake job's Spark errors become Sluice's: the cause a caller can act on."""

from __future__ import annotations

import pytest
from pyspark.errors import PythonException

from pipeline.errors import LakeError, LakePathError, RedisUnavailable, SparkUnavailable
from pipeline.lake.write.jobs import run_spark, worker_cause

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


#: A task's Parquet write to an S3 store that went down (pyarrow's error, as a worker raised it).
STORE_DOWN = (
    "OSError: When initiating multiple part upload for key 'l/stream_entries/stream=c/part-0.parquet'"
    " in bucket 'lake': AWS Error NETWORK_CONNECTION during CreateMultipartUpload operation: "
    "curlCode: 7, Could not connect to server\n"
)
TRACE = (
    '  File "/work/pipeline/lake/write/arrowtask.py", line 100, in write_ranges\n'
    "    yield _write_range(task, int(index))\n"
)
#: How a Spark Connect client words a worker's error (seen with pyspark 4.2): the traceback
#: starts at the end of the server's line, and an indented SQLSTATE line follows it.
CONNECT = (
    "\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
    "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: "
    "Traceback (most recent call last):\n"
)


@pytest.mark.parametrize("head", [WORKER, CONNECT], ids=["local", "connect"])
def test_a_store_down_under_a_task_is_the_stores_refusal_in_one_line(head: str) -> None:
    with pytest.raises(LakePathError) as caught:
        run_spark(
            "archive of 'c' [0, 10)", lambda: _raise(head + TRACE + STORE_DOWN + " SQLSTATE: 38000")
        )
    assert str(caught.value) == (
        "archive of 'c' [0, 10) failed: a Spark task could not use the lake: "
        "the store refused the connection (is it running?)"
    )


def test_a_tasks_own_error_is_named_with_its_type_not_sparks_first_line() -> None:
    text = WORKER + TRACE + "ValueError: no\nDuring handling of the above exception, another "
    text += "exception occurred:\n\nTraceback (most recent call last):\n" + TRACE
    text += "KeyError: 'block'\n\nJVM stacktrace:\norg.apache.spark.SparkException: Job aborted\n"
    with pytest.raises(LakeError) as caught:
        run_spark("archive", lambda: _raise(text))
    assert type(caught.value) is LakeError
    assert str(caught.value) == "archive failed in a Spark task: KeyError: 'block'"


def test_worker_cause_needs_a_traceback() -> None:
    assert worker_cause("failed to connect: Connection refused") is None
    assert worker_cause(WORKER + TRACE + "pyarrow.lib.ArrowIOError: gone\n") == (
        "pyarrow.lib.ArrowIOError", "gone",
    )  # fmt: skip
