"""Helpers shared by the Spark lake jobs: table creation and lake-path checks.

Imported only by the Spark jobs (archive, canonical, maintain); Spark itself
is imported lazily so this module stays cheap to import.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pipeline.errors import LakeError, LakePathError, RedisUnavailable, SparkUnavailable
from pipeline.lake.storage import store, tables
from pipeline.settings import LakeSettings

_CREATE_ATTEMPTS = 5
#: Test hook of the task-control tests: while the file this variable names
#: exists and its text occurs in the job's command line, the job writes
#: ``pid:<pid>`` into it and holds right before its Spark work (so a test can
#: mark the task failed mid-job). Unset in any deployment.
HOLD_ENV = "SLUICE_TEST_HOLD_FILE"
#: Longest a job holds for that hook, in seconds.
HOLD_MAX_S = 300.0


def table_sql(lake: LakeSettings, name: str) -> str:
    """The Spark SQL identifier of a lake table (a path-based Delta table)."""
    return "delta.`" + lake.table(name).replace("`", "``") + "`"


def check_lake_path(lake: LakeSettings) -> None:
    """Fail early with :class:`LakePathError` when the lake root cannot be written.

    On object storage: when the store does not answer or the bucket is missing.
    """
    if lake.remote:
        store.check_reachable(lake)
        return
    root = Path(lake.uri)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LakePathError(f"cannot create the lake directory {root}: {exc}") from exc
    if not os.access(root, os.W_OK | os.X_OK):
        raise LakePathError(f"the lake directory {root} is not writable")
    for name in tables.LAYOUT:
        table = root / name
        if table.exists() and not os.access(table, os.W_OK | os.X_OK):
            raise LakePathError(f"the lake table {table} is not writable")


def ensure_tables(lake: LakeSettings) -> None:
    """Create the lake tables that do not exist yet, with :data:`tables.TABLE_PROPERTIES`.

    Created with delta-rs (no JVM needed, and much faster than Spark DDL);
    Spark writes them afterwards. Safe to race with another job creating the
    same table: a lost race is retried and then finds the table in place.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    check_lake_path(lake)
    for name, (schema, partitions) in tables.LAYOUT.items():
        uri = lake.table(name)
        for attempt in range(_CREATE_ATTEMPTS):
            if store.is_table(lake, name):
                break
            try:
                DeltaTable.create(
                    uri,
                    schema,
                    mode="ignore",
                    partition_by=list(partitions) or None,
                    configuration=dict(tables.TABLE_PROPERTIES),
                    storage_options=store.delta_options(lake),
                )
                break
            except OSError as exc:
                raise LakePathError(f"cannot create {uri}: {store.describe(exc)}") from exc
            except DeltaError as exc:  # a concurrent create committed version 0 first
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise LakePathError(f"cannot create {uri}: {exc}") from exc


T = TypeVar("T")


def run_spark(what: str, work: Callable[[], T]) -> T:
    """Run Spark work, turning Spark's errors into Sluice's with a clear message.

    A Redis failure inside a Python worker becomes :class:`RedisUnavailable`;
    any other error a worker raised is named by its own last line
    (:func:`worker_cause`), not Spark's "An exception was thrown from the Python
    worker": a store (or disk) that failed a task's request is a
    :class:`LakePathError` with the store's reason in one line (S3 down: "the store
    refused the connection"), anything else :class:`LakeError` naming ``what``
    failed and the worker's error. Without a worker's traceback: a lost Connect
    server is :class:`SparkUnavailable`, a permission problem under the lake
    :class:`LakePathError`.
    """
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    errors: tuple[type[BaseException], ...] = (PySparkException, Py4JError)
    try:
        import grpc  # type: ignore[import-untyped]

        errors += (grpc.RpcError,)
    except ImportError:  # no Connect client installed: local mode only
        pass
    _test_hold()
    try:
        return work()
    except errors as exc:
        text = str(exc)
        first = _first_line(text)
        # Redis first: a task's "Connection refused" from Redis is not Spark Connect's.
        if "RedisUnavailable" in text or "redis.exceptions.ConnectionError" in text:
            cause = _worker_error(text, ("RedisUnavailable: ", "ConnectionError: ")) or first
            raise RedisUnavailable(f"{what} failed: Redis is unavailable ({cause})") from exc
        raised = worker_cause(text)
        if raised is not None:  # Spark answered: a task raised, and its error is the cause
            kind, message = raised
            if kind.rpartition(".")[2] in _STORE_ERRORS:
                reason = store.describe(OSError(message))
                raise LakePathError(
                    f"{what} failed: a Spark task could not use the lake: {reason}"
                ) from exc
            raise LakeError(f"{what} failed in a Spark task: {kind}: {message}"[:600]) from exc
        if _connect_lost(exc, text):
            raise SparkUnavailable(
                f"{what} failed: the Spark Connect server went away ({first})"
            ) from exc
        if "Permission denied" in text or "AccessDenied" in text:
            raise LakePathError(f"{what} failed: the lake is not writable ({first})") from exc
        raise LakeError(f"{what} failed: {first}") from exc


def _test_hold() -> None:
    """The :data:`HOLD_ENV` test hook (a no-op unless a test armed it)."""
    import sys
    import time

    path = os.environ.get(HOLD_ENV)
    if not path:
        return
    try:
        wanted = Path(path).read_text()
    except OSError:
        return  # not armed
    if wanted.startswith("pid:") or wanted not in " ".join(sys.argv):
        return
    Path(path).write_text(f"pid:{os.getpid()}")
    deadline = time.monotonic() + HOLD_MAX_S
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def _worker_error(text: str, marks: tuple[str, ...]) -> str | None:
    """The message of the first line of a Python worker's traceback carrying one of
    ``marks`` (Spark's own first line only says a worker raised)."""
    for line in text.splitlines():
        for mark in marks:
            at = line.find(mark)
            if at >= 0:
                return line[at + len(mark) :].strip()[:500]
    return None


#: Exception types a Python worker raises when the lake's store (or disk) failed a request.
_STORE_ERRORS = frozenset(
    {"OSError", "IOError", "ArrowIOError", "FileNotFoundError", "PermissionError",
     "ConnectionError", "ConnectionRefusedError", "ConnectionResetError", "TimeoutError"}
)  # fmt: skip
_TRACEBACK = "Traceback (most recent call last):"
_RAISED = re.compile(r"([A-Za-z_][\w.]*): (.*)")


def worker_cause(text: str) -> tuple[str, str] | None:
    """``(exception type, message)`` a Python worker's traceback in a Spark error ends
    with, or None when ``text`` holds no such traceback.

    Spark's own first line only says that a worker raised ("An exception was
    thrown from the Python worker"); the cause is the traceback's last
    exception line (of a chain, the one raised last). A JVM stack trace after it
    is not read, nor Connect's indented ``SQLSTATE`` line.
    """
    found: tuple[str, str] | None = None
    inside = False
    for line in text.splitlines():
        if line.startswith(("JVM stacktrace:", "\tat ")):
            break
        if line.rstrip().endswith(_TRACEBACK):  # (through Connect: at the end of Spark's line)
            inside = True
            continue
        if not inside or not line or line[0].isspace():
            continue
        match = _RAISED.fullmatch(line.rstrip())
        if match is not None:
            found = (match.group(1), match.group(2).strip()[:500])
    return found


def _first_line(text: str) -> str:
    """The telling line of a Spark error (gRPC errors put theirs in ``details = "..."``)."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("details = "):
            return stripped[len("details = ") :].strip('"')[:500]
    return next((line for line in text.splitlines() if line.strip()), text)[:500]


def _connect_lost(exc: BaseException, text: str) -> bool:
    """True when a Spark Connect call failed because the server is gone or unreachable."""
    code = getattr(exc, "getGrpcStatusCode", None)
    status = ""
    if callable(code):
        status = str(code())
    elif callable(getattr(exc, "code", None)):
        status = str(exc.code())  # type: ignore[attr-defined]
    return "UNAVAILABLE" in status or (
        "StatusCode.UNAVAILABLE" in text or "Connection refused" in text or "Socket closed" in text
    )


def delta_retry(what: str, action: Callable[[], T], attempts: int = 12) -> T:
    """Run a delta-rs write, retrying a bounded number of times on commit conflicts.

    A conflict is a lost race for the next table version: another writer's
    commit got it first (a local rename, or an S3 conditional put, found the
    version taken). delta-rs rebases what it can; what it cannot is retried
    here on the new version, and raised as :class:`LakeError` when it keeps
    losing: never dropped.
    """
    import random
    import time

    from deltalake.exceptions import CommitFailedError

    for attempt in range(attempts):
        try:
            return action()
        except CommitFailedError as exc:
            if attempt == attempts - 1:
                raise LakeError(f"{what}: commit kept conflicting: {exc}") from exc
            # jittered: writers that lost the same race do not meet again at once
            time.sleep(min(2.0, 0.05 * (2**attempt)) * (0.5 + random.random()))
        except OSError as exc:  # the store (or the disk) failed the commit: nothing was committed
            raise LakePathError(f"{what}: {store.describe(exc)}") from exc
    raise AssertionError("unreachable")
