"""``sluice spark``'s one line on why its JVM exited (exit_cause); the server runs in
tests/integration/lake/test_sparkserver*.py."""

from __future__ import annotations

from pipeline.lake.spark.server import exit_cause

#: What a local-master JVM logs when a task runs out of heap (Spark 4.2, shortened).
OUT_OF_HEAP = """\
26/11/29 09:38:51 ERROR Executor: Exception in task 0.0 in stage 0.0 (TID 0)
java.lang.OutOfMemoryError: Java heap space
\tat java.base/java.util.Arrays.copyOf(Arrays.java:3481)
26/11/29 09:38:51 ERROR SparkUncaughtExceptionHandler: Uncaught exception in thread \
Thread[Executor task launch worker for task 0.0 in stage 0.0 (TID 0),5,main]
java.lang.OutOfMemoryError: Java heap space
26/11/29 09:38:51 INFO SparkContext: Invoking stop() from shutdown hook
26/11/29 09:38:52 INFO SparkContext: Successfully stopped SparkContext (Uptime: 61459 ms)
"""


def test_a_task_out_of_heap_is_named_with_its_thread_and_error() -> None:
    assert exit_cause(52, OUT_OF_HEAP) == (
        "exit code 52: out of memory (Uncaught exception in thread Thread[Executor task "
        "launch worker for task 0.0 in stage 0.0 (TID 0),5,main]: "
        "java.lang.OutOfMemoryError: Java heap space)"
    )


def test_signals_and_plain_codes() -> None:
    assert exit_cause(-9, OUT_OF_HEAP.split("ERROR")[0]) == "killed by SIGKILL"
    assert exit_cause(143, "26/11/29 INFO SparkContext: Invoking stop() from shutdown hook") == (
        "exit code 143: SIGTERM, its shutdown hooks ran"
    )
    assert exit_cause(1, "") == "exit code 1"
    assert exit_cause(50, "") == "exit code 50: an uncaught exception"
    # An OutOfMemoryError without the handler's line is still the cause named.
    assert exit_cause(52, "x\njava.lang.OutOfMemoryError: Direct buffer memory\n") == (
        "exit code 52: out of memory (java.lang.OutOfMemoryError: Direct buffer memory)"
    )
