"""What kind of Redis failure an exception is: the ``kind`` label of the processes' error counters.

:func:`error_kind` names one of :data:`KINDS` for any exception a Redis call
can raise (redis-py's, the socket's, an ``asyncio.timeout`` around the call,
Sluice's :class:`~pipeline.errors.NotReplicated`). Whether to retry stays the
question of :func:`pipeline.redisio.conn.unavailable`; this only says which
failure it was, so that ``/metrics`` tells a Redis that is away from one that
is there and refusing writes, and why:

========== ==============================================================================
kind       what Redis did
========== ==============================================================================
connection the connection was refused, reset or lost; no free pooled connection
timeout    no answer in time (a stalled or stopped server, a slow command)
loading    ``LOADING``: the server is loading its data set after a start
failover   ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``, an uncovered slot, no master yet
readonly   ``READONLY``: a replica, or a master demoted under the client
oom        ``OOM``: ``maxmemory`` reached under ``noeviction``
misconf    ``MISCONF``: the last RDB save failed and ``stop-writes-on-bgsave-error`` is on
noreplicas ``NOREPLICAS`` (``min-replicas-to-write``), or fewer replicas than
           ``SLUICE_REDIS_MIN_REPLICAS`` acknowledged a write in time
busy       ``BUSY``: a script or function has run past its time limit
auth       a wrong password or user, a command the user may not run
other      anything else (``WRONGTYPE``, a bad reply...): a fault, not an outage
========== ==============================================================================
"""

from __future__ import annotations

from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFound
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError

from pipeline.errors import NotReplicated

#: Every kind :func:`error_kind` names, in the order ``/metrics`` lists them.
KINDS: tuple[str, ...] = (
    "connection",
    "timeout",
    "loading",
    "failover",
    "readonly",
    "oom",
    "misconf",
    "noreplicas",
    "busy",
    "auth",
    "other",
)

#: Classes first (most specific before their bases), then a reply's first word.
_BY_CLASS: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((RedisTimeoutError, TimeoutError), "timeout"),
    ((BusyLoadingError,), "loading"),
    ((AuthenticationError, AuthorizationError, NoPermissionError), "auth"),
    (
        (MasterNotFoundError, AsyncMasterNotFound, ClusterDownError, TryAgainError),
        "failover",
    ),
    ((SlotNotCoveredError,), "failover"),
    ((RedisConnectionError, OSError), "connection"),
    ((ReadOnlyError,), "readonly"),
    ((OutOfMemoryError,), "oom"),
    ((NotReplicated,), "noreplicas"),
)
_BY_CODE: tuple[tuple[str, str], ...] = (
    ("MISCONF ", "misconf"),
    ("NOREPLICAS ", "noreplicas"),
    ("BUSY ", "busy"),
    ("READONLY ", "readonly"),
    ("OOM ", "oom"),
    ("LOADING ", "loading"),
    ("MASTERDOWN ", "failover"),
)


def error_kind(exc: BaseException) -> str:
    """The kind (one of :data:`KINDS`) of a failed Redis call's exception."""
    for classes, kind in _BY_CLASS:
        if isinstance(exc, classes):
            return kind
    if isinstance(exc, ResponseError):
        text = str(exc)
        for code, kind in _BY_CODE:
            if text.startswith(code):
                return kind
    return "other"


__all__ = ["KINDS", "error_kind"]
