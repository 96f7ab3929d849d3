"""Where the lake's bytes live: one way to open its tables and files, local or on S3.

Every delta-rs call of Sluice opens tables through :func:`open_table` /
:func:`is_table` and every pyarrow file access goes through :func:`filesystem`;
both derive from :meth:`pipeline.settings.LakeSettings.storage_options`, the
one translation of the ``lake_s3_*`` settings. Spark never reads or writes an
object-store lake (see docs/DESIGN.md, "The lake on object storage"): its
tasks write data files through pyarrow and delta-rs commits them. Nothing here logs an option: they
hold the secret key.

A store that cannot be read (down, missing bucket, bad credentials) is raised
as :class:`~pipeline.errors.LakePathError` with one line naming the table and
the store's own reason (:func:`describe`), never the request's details.

No Spark import here: the JVM-free reader and the resumption server use it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

from pipeline.errors import LakePathError
from pipeline.settings import LakeSettings


def delta_options(lake: LakeSettings) -> dict[str, str] | None:
    """delta-rs ``storage_options`` of ``lake`` (None for a local lake)."""
    return lake.storage_options() or None


def open_table(lake: LakeSettings, name: str, *, version: int | None = None) -> Any:
    """The delta-rs ``DeltaTable`` of lake table ``name`` (``LakePathError`` when unreadable)."""
    from deltalake import DeltaTable

    uri = lake.table(name)
    try:
        return DeltaTable(uri, version=version, storage_options=delta_options(lake))
    except OSError as exc:
        raise LakePathError(f"cannot read the lake table {uri}: {describe(exc)}") from exc


def is_table(lake: LakeSettings, name: str) -> bool:
    """True when lake table ``name`` exists (``LakePathError`` when the store cannot say)."""
    from deltalake import DeltaTable

    uri = lake.table(name)
    try:
        return bool(DeltaTable.is_deltatable(uri, delta_options(lake)))
    except OSError as exc:
        raise LakePathError(f"cannot read the lake table {uri}: {describe(exc)}") from exc


def check_reachable(lake: LakeSettings) -> None:
    """Raise :class:`LakePathError` unless the lake's store answers (bucket there, key valid).

    For a local lake, nothing: local paths are checked where they are written.
    """
    if not lake.remote:
        return
    import pyarrow.fs as pafs

    fs, root = filesystem(lake, lake.uri)
    bucket = root.split("/", 1)[0]
    try:
        info = fs.get_file_info(bucket)
    except OSError as exc:
        raise LakePathError(
            f"the lake store at {lake.uri} is unavailable: {describe(exc)}"
        ) from exc
    if info.type == pafs.FileType.NotFound:
        raise LakePathError(f"the lake's bucket {bucket!r} does not exist ({lake.uri})")


def filesystem(lake: LakeSettings, uri: str) -> tuple[Any, str]:
    """``(pyarrow FileSystem, path)`` for ``uri`` under ``lake`` (a table or one of its files)."""
    import pyarrow.fs as pafs

    if not lake.remote:
        return pafs.LocalFileSystem(), uri
    parsed = urlparse(uri)
    return s3_filesystem(lake.storage_options()), f"{parsed.netloc}{parsed.path}".rstrip("/")


def s3_filesystem(options: dict[str, str]) -> Any:
    """A pyarrow ``S3FileSystem`` from delta-rs storage options (picklable input for tasks)."""
    import pyarrow.fs as pafs

    endpoint = options.get("AWS_ENDPOINT_URL", "")
    parsed = urlparse(endpoint)
    timeout = float(options.get("timeout", "30s").rstrip("s"))
    return pafs.S3FileSystem(
        access_key=options.get("AWS_ACCESS_KEY_ID"),
        secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
        region=options.get("AWS_REGION"),
        endpoint_override=parsed.netloc or None,
        scheme=parsed.scheme or "https",
        force_virtual_addressing=options.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST") == "true",
        connect_timeout=min(timeout, 10.0),
        request_timeout=timeout,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(
            max_attempts=int(options.get("max_retries", "2")) + 1
        ),
    )


#: The telling part of an object_store / AWS SDK error, in order of preference.
_REASONS = (
    (re.compile(r"Connection refused|tcp connect error|error trying to connect|"
                r"Could not connect|NETWORK_CONNECTION", re.I),
     "the store refused the connection (is it running?)"),
    (re.compile(r"NoSuchBucket|bucket does not exist|specified bucket", re.I),
     "the bucket does not exist"),
    (re.compile(r"InvalidAccessKeyId|SignatureDoesNotMatch|Access_?Denied|Forbidden|403", re.I),
     "access denied (check lake_s3_access_key / lake_s3_secret_key)"),
    (re.compile(r"timed out|timeout", re.I), "the store did not answer in time"),
)  # fmt: skip


def store_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a delta-rs or pyarrow call raises when the store fails it."""
    from deltalake.exceptions import DeltaError

    return (OSError, DeltaError)


def describe(exc: BaseException) -> str:
    """One line saying why a store request failed, without the request's details."""
    text = str(exc)
    for pattern, reason in _REASONS:
        if pattern.search(text):
            return reason
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first[:300]


__all__ = [
    "check_reachable",
    "delta_options",
    "describe",
    "filesystem",
    "is_table",
    "open_table",
    "s3_filesystem",
    "store_errors",
]
