"""Build the SparkSession with Delta: a Spark Connect client, or a local one-JVM session.

Two modes, picked by ``settings.spark.remote`` (``SLUICE_SPARK_REMOTE``):

- ``sc://host:port``: the job is a thin Spark Connect client of a long-lived
  server (``sluice spark`` locally, a service in docker/). No JVM starts in
  the job's process; the server already holds the Delta jars and warm caches.
  The server is checked with a plain TCP connect first, so a server that is
  down fails in milliseconds with one line naming the URL, and the client's
  gRPC retries are bounded (:data:`CONNECT_RETRIES`), so a server that dies
  mid-job fails the job in seconds instead of the client's default ten minutes.
- empty: a local Spark driver in this process, for ``settings.spark.master``.
  The Delta jars are passed as file paths (``spark.jars``) from the manifest
  ``python -m pipeline.lake.spark.session --warm`` wrote (``make install`` runs it),
  so no Ivy resolution runs at start; without a manifest it falls back to
  ``spark.jars.packages`` (Ivy, cached under ``~/.ivy2*``).

:func:`spark_conf` is the one list of settings both modes (and the Connect
server of :mod:`pipeline.lake.spark.server`) run with.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlparse

from pipeline.errors import ConfigError, SparkUnavailable
from pipeline.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

APP_NAME = "sluice"
#: Retries of one Connect RPC whose server is unreachable (backoff 0.2 s doubling to 2 s: ~5 s).
CONNECT_RETRIES = 4
#: Seconds a TCP connect to the Connect server may take before the job gives up.
CONNECT_PROBE_S = 3.0
#: The gRPC channel argument that gives a channel its own connections (see connect_session).
LOCAL_SUBCHANNELS = "grpc.use_local_subchannel_pool"
#: The manifest of cached Delta jar paths, next to the interpreter that resolved them.
MANIFEST = Path(sys.prefix) / "share" / "sluice" / "delta-jars.json"


def delta_package() -> str:
    """Maven coordinates of the Delta jar matching the installed pyspark and delta-spark."""
    from importlib.metadata import version

    import pyspark

    spark_mm = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_mm}_2.13:{version('delta-spark')}"


def cached_jars(settings: Settings | None = None, manifest: Path = MANIFEST) -> list[str] | None:
    """The Delta jar paths to pass as ``spark.jars``, or None when there is no usable cache.

    ``settings.spark.jars`` (comma-separated) wins; else the manifest, used
    only when it was written for this very Delta package and every jar is
    still on disk.
    """
    if settings is not None and settings.spark.jars:
        return [part.strip() for part in settings.spark.jars.split(",") if part.strip()]
    try:
        doc = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    jars = doc.get("jars")
    if doc.get("package") != delta_package() or not isinstance(jars, list) or not jars:
        return None
    paths = [str(j) for j in jars]
    if not all(Path(p.removeprefix("file://")).is_file() for p in paths):
        return None
    return drop_provided(paths)


def drop_provided(paths: list[str]) -> list[str]:
    """``paths`` without the jars whose artifact Spark ships itself (in ``pyspark/jars``).

    Ivy resolves Delta's whole dependency tree, ~86 MB: Hadoop's client, Parquet,
    Jackson, log4j, in versions older than Spark's own. On ``spark.jars`` they
    slow every start (and every local executor's first task fetches them) while
    Spark's copies win anyway (its class loader looks there first). Kept: what
    only Delta brings (delta-*, unitycatalog-*, ...).
    """
    import pyspark

    shipped = {
        _artifact(jar.name) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")
    }
    kept = []
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        # Ivy's cache names jars ``<organisation>_<artifact>-<revision>.jar``.
        if _artifact(name.split("_", 1)[-1]) not in shipped:
            kept.append(path)
    return kept


def _artifact(jar_name: str) -> str:
    """``parquet-hadoop-1.16.0.jar`` -> ``parquet-hadoop``."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar_name)


def spark_conf(settings: Settings, *, jars: bool = True) -> dict[str, str]:
    """Spark settings of every lake session (and of the Connect server).

    ``jars``: add the Delta jars (cached paths, else Maven coordinates); a
    Connect client leaves them to its server.
    """
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.shuffle.partitions": str(settings.spark.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": settings.spark.driver_memory,
        # Python workers fork from a daemon that has the data source imported.
        "spark.python.daemon.module": "pipeline.lake.spark.pydaemon",
        # A Connect server caches analyzed plans per session, and a Python data
        # source's partitions (the Redis id ranges found at planning) with them:
        # the same read repeated later would miss entries added since. Off.
        "spark.connect.session.planCache.enabled": "false",
        # Lake columns are mostly unique (hashes, ids, payloads): Parquet's
        # dictionary encoding only costs CPU before it falls back (~2x on writes).
        "spark.hadoop.parquet.enable.dictionary": "false",
        # The archive caches its one Redis read for two writes, briefly: no compression.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if jars:
        cached = cached_jars(settings)
        if cached:
            conf["spark.jars"] = ",".join(cached)
        else:
            conf["spark.jars.packages"] = delta_package()
    return conf


def require_java() -> None:
    """Raise :class:`SparkUnavailable` (one line) when no Java can start a local JVM.

    Spark's launcher takes ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``;
    without either it fails with an exit code and a page of log.
    """
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise SparkUnavailable(
            f"Spark needs Java 17 or 21 and there is none ({where}): install a JDK "
            "(e.g. apt-get install openjdk-17-jre-headless) or point "
            "SLUICE_SPARK_REMOTE at a Spark Connect server"
        )


def build_session(settings: Settings | None = None, *, app_name: str = APP_NAME) -> SparkSession:
    """A SparkSession with Delta Lake: a Connect client when ``spark_remote`` is set, else local.

    Raises :class:`SparkUnavailable` (one line naming the URL) when the
    Connect server cannot be reached.
    """
    settings = settings or Settings.load()
    if settings.spark.remote:
        return connect_session(settings.spark.remote)
    require_java()
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(settings.spark.master)
    for key, value in spark_conf(settings).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def parse_remote(url: str, name: str = "SLUICE_SPARK_REMOTE") -> tuple[str, int]:
    """``sc://host:port[/;params]`` -> ``(host, port)``; raises ConfigError (naming where
    the URL came from, ``name``) otherwise."""
    parsed = urlparse(url)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise ConfigError(f"{name} must look like sc://host:port, got {url!r}")
    try:
        port = parsed.port or 15002
    except ValueError as exc:
        raise ConfigError(f"bad port in {name} {url!r}") from exc
    return parsed.hostname, port


def probe(url: str, timeout_s: float = CONNECT_PROBE_S) -> None:
    """Raise :class:`SparkUnavailable` unless something accepts TCP connections at ``url``."""
    host, port = parse_remote(url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise SparkUnavailable(
            f"the Spark Connect server at {url} is not reachable ({reason}); "
            "start one with `sluice spark` or unset SLUICE_SPARK_REMOTE"
        ) from None


def shared_session_id(url: str) -> str:
    """The server-side session every lake job of this URL joins (a UUID, stable per URL).

    Why one shared session: the server starts Python worker daemons per
    session (keyed by the session's artifact UUID) and never stops them when
    the session is released, so a session per job costs ~1 s of worker start
    per job and leaks ~6 processes per job on a long-lived server. Jobs in the
    shared session keep no state there but uniquely named temp views, and are
    stopped one by one through their own operation tag (:func:`job_tag`).
    """
    import uuid

    return str(uuid.uuid5(uuid.NAMESPACE_URL, "sluice-lake:" + url.split("/;")[0]))


def job_tag() -> str:
    """A fresh operation tag for one job (``interruptTag`` stops only that job's operations)."""
    import uuid

    return "sluice-job-" + uuid.uuid4().hex


def connect_session(url: str, *, shared: bool = True) -> SparkSession:
    """A Spark Connect session at ``url`` with bounded retries (see the module docstring).

    ``shared``: join :func:`shared_session_id` unless the URL names a
    ``session_id`` itself; end the job with :func:`close_session`, which
    keeps the shared session alive on the server.
    """
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    probe(url)
    target = url
    if shared and "session_id=" not in url:
        target = f"{url.rstrip('/')}/;session_id={shared_session_id(url)}"
    # What the classic builder's remote() does first: pyspark.sql.functions switch to
    # Connect for this process (an environment flag). A process is either a Connect
    # client or a local driver, never both.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    # A channel of its own connections: by default gRPC shares them between channels
    # to the same address, so a session built after the server was lost and started
    # again would reuse the lost connection, refused until its reconnect backoff (up
    # to minutes) ends, though the server listens again.
    channel = DefaultChannelBuilder(target, channelOptions=[(LOCAL_SUBCHANNELS, 1)])
    session = ConnectSession.builder.channelBuilder(channel).create()
    session.client.set_retry_policies(
        [
            DefaultPolicy(
                max_retries=CONNECT_RETRIES,
                initial_backoff=200,
                backoff_multiplier=2.0,
                max_backoff=2000,
                max_server_retry_delay=2000,
            )
        ]
    )
    return cast("SparkSession", session)  # the classic type, as the classic builder returns


def close_session(spark: Any) -> None:
    """End this process's use of ``spark``: a Connect client closes its channel only
    (the shared server-side session stays for the next job); a local session stops."""
    if is_connect(spark):
        spark.client.close()
    else:
        spark.stop()


def is_connect(spark: Any) -> bool:
    """True when ``spark`` is a Spark Connect client session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def write_manifest(jars: list[str], manifest: Path = MANIFEST) -> None:
    """Record the resolved Delta jar paths for :func:`cached_jars`."""
    manifest.parent.mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"package": delta_package(), "jars": jars}, indent=1))
    tmp.replace(manifest)


def _warm() -> None:
    """Resolve the Delta jars once through Ivy and record their paths in :data:`MANIFEST`."""
    from pyspark.sql import SparkSession

    settings = Settings.load(spark_master="local[1]", spark_jars="")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("sluice-warm").master("local[1]")
    for key, value in spark_conf(settings, jars=False).items():
        builder = builder.config(key, value)
    session = builder.config("spark.jars.packages", delta_package()).getOrCreate()
    try:
        session.range(1).count()
        resolved = [j for j in (session.conf.get("spark.jars", "") or "").split(",") if j]
    finally:
        session.stop()
    if not any("delta-spark" in j for j in resolved):
        raise SystemExit(f"sluice: Ivy did not resolve {delta_package()}: {resolved}")
    write_manifest(resolved)
    print(f"sluice: {len(resolved)} Delta jars cached in {MANIFEST}", file=sys.stderr)  # noqa: T201


if __name__ == "__main__":
    if sys.argv[1:] == ["--warm"]:
        _warm()
