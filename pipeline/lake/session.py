"""Build the SparkSession with Delta, for any master."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pipeline.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME = "sluice"


def delta_package() -> str:
    """Maven coordinates of the Delta jar matching the installed pyspark and delta-spark."""
    from importlib.metadata import version

    import pyspark

    spark_mm = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_mm}_2.13:{version('delta-spark')}"


def build_session(settings: Settings | None = None, *, app_name: str = APP_NAME) -> SparkSession:
    """A SparkSession with Delta Lake, for ``settings.spark_master`` (``SLUICE_SPARK_MASTER``).

    The Delta jars are resolved from Maven Central through Spark's own package
    resolution and cached under ``~/.ivy2*``; only the first run downloads them.
    """
    from pyspark.sql import SparkSession

    settings = settings or Settings.load()
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark_master)
        .config("spark.jars.packages", delta_package())
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog",
            "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        )
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.databricks.delta.properties.defaults.enableDeletionVectors", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", os.environ.get("SLUICE_SPARK_DRIVER_MEMORY", "2g"))
    )
    return builder.getOrCreate()


def _python() -> str:
    import sys

    return sys.executable


def _warm() -> None:
    """Start and stop one session so the Delta jars land in the local cache."""
    session = build_session(Settings.load(spark_master="local[1]"), app_name="sluice-warm")
    session.range(1).count()
    session.stop()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--warm"]:
        _warm()
