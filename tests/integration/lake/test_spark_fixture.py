"""The test session's Spark is replaced after a test left it broken, so the next tests pass."""

from __future__ import annotations

import pytest
from pyspark import SparkContext

from tests.support.spark import SparkHolder

pytestmark = pytest.mark.spark


def test_a_session_that_no_longer_answers_is_replaced_in_a_new_jvm(
    spark_holder: SparkHolder,
) -> None:
    broken = spark_holder.get()
    assert broken.range(2).count() == 2
    # What a timeout's signal in the middle of a py4j command leaves: a session whose
    # every call fails. Here its JVM is gone (the same outcome, reproducibly).
    gateway = SparkContext._gateway
    assert gateway is not None
    gateway.proc.kill()
    gateway.proc.wait(30)
    spark_holder.suspect = True  # what the spark fixture sets after a failed test
    fresh = spark_holder.get()
    assert spark_holder.replaced == 1
    assert fresh is not broken
    assert fresh.range(3).count() == 3
    assert spark_holder.get() is fresh  # healthy: kept


def test_a_healthy_session_is_kept_after_a_failed_test(spark_holder: SparkHolder) -> None:
    session = spark_holder.get()
    replaced = spark_holder.replaced
    spark_holder.suspect = True
    assert spark_holder.get() is session
    assert spark_holder.replaced == replaced
