"""The test session's local Spark, replaced when a test left it broken.

pytest-timeout's signal may interrupt py4j in the middle of a command; every
later call on that session then fails ("... does not exist in the JVM"), so
one slow test would fail every Spark test after it. :class:`SparkHolder`
hands out one session; after a failed test (``suspect``) it asks the session
a trivial query first and, if that fails, stops it, ends its JVM and builds a
new session in a new JVM.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger(__name__)


def build() -> Any:
    from pipeline.lake.spark.session import build_session
    from pipeline.settings import Settings

    settings = Settings.load(spark_master="local[2]", spark_shuffle_partitions=2)
    return build_session(settings, app_name="sluice-tests")


def answers(session: Any) -> bool:
    """Does the session still run a query (and get the right answer)?"""
    try:
        return bool(session.range(3).count() == 3)
    except Exception as exc:  # noqa: BLE001 - a broken py4j link fails any way: that is the answer
        log.warning("the test Spark session no longer answers: %r", exc)
        return False


def end_jvm() -> None:
    """Stop the JVM behind py4j and forget the session, so the next one starts anew.

    pyspark keeps its gateway, context and session in class attributes for the
    whole process and reuses them for every later session; a stop that failed
    half-way leaves them set, and pyspark has no public call to reset them (tests only).
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    if gateway is None:
        return
    try:
        gateway.shutdown()
    finally:
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.kill()
            proc.wait(30)
            if proc.stdin is not None:  # the JVM's lifeline (it exits when it closes)
                proc.stdin.close()


class SparkHolder:
    def __init__(self) -> None:
        self.session: Any = None
        #: Set after a test that used the session failed: check it before the next use.
        self.suspect = False
        #: Sessions replaced because they no longer answered.
        self.replaced = 0

    def get(self) -> Any:
        if self.session is not None and self.suspect and not answers(self.session):
            self.discard()
            self.replaced += 1
        self.suspect = False
        if self.session is None:
            self.session = build()
        return self.session

    def discard(self) -> None:
        session, self.session = self.session, None
        try:
            with warnings.catch_warnings():  # "Unable to cleanly shutdown Spark JVM process"
                warnings.simplefilter("ignore", RuntimeWarning)
                session.stop()
        except Exception as exc:  # noqa: BLE001 - a broken session may fail to stop any way
            log.warning("stopping the broken test Spark session failed: %r", exc)
        end_jvm()

    def close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            session.stop()
