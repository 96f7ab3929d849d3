"""The ``lake`` section: the Delta lake, its object storage, and the Airflow jobs that fill it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlparse

from pipeline.settings.fields import (
    Names,
    NonEmpty,
    PositiveInt,
    bare,
    check,
    flat_of,
    invalid,
    variable,
)

#: URI schemes of a lake on object storage.
OBJECT_STORE_SCHEMES = ("s3://", "s3a://")
#: The archive's writers (see :mod:`pipeline.lake.archive`).
ARCHIVE_WRITERS = ("arrow", "spark")
#: How commits on object storage stay safe with several writers.
CONDITIONAL_PUTS = ("etag", "unsafe-rename")
#: Cron's named schedules (croniter's, which Airflow and the backfill read).
CRON_PRESETS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


@dataclass(frozen=True, slots=True, kw_only=True)
class LakeSettings:
    """The Delta lake and the Airflow jobs that fill and keep it."""

    _SECTION: ClassVar[str] = "lake"

    #: Root of the Delta tables: a local path (made absolute when built) or an object-store URI.
    uri: NonEmpty = "./var/lake"
    #: Streams archived by ``sluice_archive`` (logical stream names).
    streams: Names = bare(("chain:demo",))
    #: Which of those carry one block batch per entry.
    chain_streams: Names = bare(("chain:demo",))
    #: When the archive runs: five cron fields (UTC), or a preset such as ``@hourly``.
    archive_cron: str = bare("*/5 * * * *")
    #: Most Spark tasks (id ranges) one stream's interval is archived in.
    archive_partitions: PositiveInt = bare(4)
    #: Entries one of those ranges is planned for: an interval expected to hold fewer
    #: entries than ``archive_partitions`` times this gets fewer ranges (each costs a Spark
    #: task, a Redis connection and a file per table). 1: always ``archive_partitions``.
    archive_range_entries: PositiveInt = bare(4096)
    #: How the archive writes: ``arrow`` (tasks write Parquet with pyarrow, the driver commits
    #: with delta-rs; the Spark writer where the lake already holds part of the interval) or
    #: ``spark`` (always the Spark writer). See :mod:`pipeline.lake.write.arrowwrite`.
    archive_writer: str = bare("arrow")
    #: How many canonical jobs of the archive DAG's runs may run at once (the DAG's tasks are
    #: bounded together by its Airflow pool, ``sluice_archive``).
    archive_parallelism: PositiveInt = bare(1)
    #: Streams per ``archive`` task of a ``sluice_archive`` run: the run's streams are cut
    #: into shards of at most this many, each one task that reports its streams' results
    #: from the shared job (and archives those that failed there in one job of its own).
    archive_shard_streams: PositiveInt = bare(100)
    #: How many streams one shared archive job (``archive-streams``) archives at once: a slow
    #: stream (a MERGE, a catch-up) holds one of them, never the rest.
    archive_job_workers: PositiveInt = bare(256)
    #: Entries younger than this stay in Redis even when archived.
    hot_retention_s: int = bare(3600)
    reorg_threshold: int = bare(64)
    #: Wall-clock limit of one lake job child process (archive, canonical, trim...).
    job_timeout_s: PositiveInt = 1800
    #: Retries of a failed lake task (every lake job is idempotent, so retrying is safe).
    task_retries: int = 3
    #: How long a lake job waits for its stream's archive lock (another job on the stream).
    lock_wait_s: int = 600
    # Object storage (a lake at ``s3://bucket/prefix``): passed to delta-rs, pyarrow and
    # Spark alike through :meth:`storage_options` (see pipeline.lake.storage.store). Empty
    # credentials: the AWS_* environment, profile or instance role.
    #: ``http(s)://host:port`` of an S3-compatible server ("" = AWS S3 itself).
    s3_endpoint: str = ""
    s3_region: str = "us-east-1"
    #: Set with ``s3_secret_key`` or not at all.
    s3_access_key: str = ""
    #: Never shown: left out of ``repr`` (and so of every logged settings object).
    s3_secret_key: str = field(default="", repr=False)
    #: Path-style requests (``endpoint/bucket/key``), what most S3-compatible servers need.
    s3_path_style: bool = True
    #: Allow an ``http://`` endpoint (plain text: a test or a private network only).
    s3_allow_http: bool = False
    #: How commits stay safe with several writers: ``etag`` (S3 conditional puts, the
    #: default) or ``unsafe-rename`` (no protection: one writer at a time only).
    s3_conditional_put: str = "etag"
    #: Seconds one object-store request may take, and retries of a failed one: a store
    #: that is down fails a job in seconds, not after the client's default minutes.
    s3_timeout_s: PositiveInt = 30
    s3_max_retries: int = 2

    def __post_init__(self) -> None:
        check(self)
        _check_uri(self)
        _check_cron(self)
        _check_writer(self)
        _check_object_store(self)

    @property
    def min_retain_hours(self) -> int:
        """The least VACUUM retention that is safe beside running jobs, in whole hours.

        VACUUM (full mode) deletes files no commit references once older than
        the retention: an archive job's files are unreferenced until its commit,
        and a job may run up to ``job_timeout_s``.
        """
        return max(1, math.ceil(self.job_timeout_s / 3600))

    @property
    def remote(self) -> bool:
        """True when the lake is on object storage (``s3://``), not a local directory."""
        return self.uri.startswith(OBJECT_STORE_SCHEMES)

    def storage_options(self) -> dict[str, str]:
        """delta-rs (object_store) storage options of this lake; empty for a local lake.

        The one translation of the ``lake_s3_*`` settings: pyarrow's and Spark's
        are derived from it (:mod:`pipeline.lake.storage.store`). Holds the secret: never log it.
        """
        if not self.remote:
            return {}
        options = {
            "AWS_REGION": self.s3_region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if self.s3_path_style else "true",
            "AWS_ALLOW_HTTP": "true" if self.s3_allow_http else "false",
            "timeout": f"{self.s3_timeout_s}s",
            "connect_timeout": f"{min(self.s3_timeout_s, 10)}s",
            "max_retries": str(self.s3_max_retries),
            "retry_timeout": f"{self.s3_timeout_s}s",
        }
        if self.s3_conditional_put == "etag":
            options["AWS_CONDITIONAL_PUT"] = "etag"
        else:
            options["AWS_S3_ALLOW_UNSAFE_RENAME"] = "true"
        if self.s3_endpoint:
            options["AWS_ENDPOINT_URL"] = self.s3_endpoint
        if self.s3_access_key:
            options["AWS_ACCESS_KEY_ID"] = self.s3_access_key
            options["AWS_SECRET_ACCESS_KEY"] = self.s3_secret_key
        return options

    @classmethod
    def from_url(cls, url: str) -> LakeSettings:
        """The lake at ``url`` with every other lake setting at its default."""
        return cls(uri=url)

    def table(self, name: str) -> str:
        """The URI of one table under the lake root."""
        return f"{self.uri.rstrip('/')}/{name}"


def _check_uri(lake: LakeSettings) -> None:
    """A local path (made absolute here) or ``s3://bucket/prefix``."""
    if "://" not in lake.uri or lake.uri.startswith("file://"):
        path = Path(lake.uri.removeprefix("file://")).expanduser().absolute()
        object.__setattr__(lake, "uri", str(path))
    elif not lake.uri.startswith(OBJECT_STORE_SCHEMES):
        raise invalid(lake, "uri", f"must be a local path or s3://bucket/prefix, got {lake.uri!r}")
    elif not urlparse(lake.uri).netloc:
        raise invalid(lake, "uri", f"names no bucket: {lake.uri!r}")


def _check_cron(lake: LakeSettings) -> None:
    """The shape of a cron expression; the jobs' croniter reads the fields themselves."""
    cron = lake.archive_cron.strip()
    if cron in CRON_PRESETS or len(cron.split()) in (5, 6):
        return
    raise invalid(
        lake,
        "archive_cron",
        f"must be five cron fields (minute hour day month weekday) or one of "
        f"{', '.join(CRON_PRESETS)}, got {lake.archive_cron!r}",
    )


def _check_writer(lake: LakeSettings) -> None:
    # The archive job named the variable in these two errors before they moved here: kept.
    if lake.archive_writer not in ARCHIVE_WRITERS:
        raise invalid(
            lake,
            "archive_writer",
            f"must be arrow or spark, got {lake.archive_writer!r}",
            say_variable=True,
        )
    if lake.archive_writer != "arrow" and lake.remote:
        raise invalid(
            lake,
            "archive_writer",
            f"must be arrow for a lake on object storage ({lake.uri}): Spark does not write to it",
            say_variable=True,
        )


def _check_object_store(lake: LakeSettings) -> None:
    """How commits are kept safe, the endpoint's form, and the credentials' pair."""
    if lake.s3_conditional_put not in CONDITIONAL_PUTS:
        raise invalid(
            lake,
            "s3_conditional_put",
            f"must be etag or unsafe-rename, got {lake.s3_conditional_put!r}",
        )
    if lake.s3_endpoint:
        scheme = urlparse(lake.s3_endpoint).scheme
        if scheme not in ("http", "https"):
            raise invalid(
                lake, "s3_endpoint", f"must be http(s)://host:port, got {lake.s3_endpoint!r}"
            )
        if scheme == "http" and not lake.s3_allow_http:
            allow = flat_of(lake, "s3_allow_http")
            raise invalid(
                lake,
                "s3_endpoint",
                f"is plain http: set {allow} ({variable(allow)}=true) to allow it",
            )
    # One without the other signs no request: the store would refuse every one.
    if bool(lake.s3_access_key) != bool(lake.s3_secret_key):
        given, missing = "s3_access_key", "s3_secret_key"
        if not lake.s3_access_key:
            given, missing = missing, given
        raise invalid(
            lake, given, f"is set but {flat_of(lake, missing)} is not: set both or neither"
        )
