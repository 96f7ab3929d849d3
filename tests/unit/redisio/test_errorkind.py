"""Each failure a Redis call can raise has one kind; the write refusals are retried as outages."""

from __future__ import annotations

import pytest
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFound
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    NoPermissionError,
    NoScriptError,
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
from pipeline.redisio.conn import unavailable
from pipeline.redisio.errorkind import KINDS, error_kind


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (RedisConnectionError("Connection refused"), "connection"),
        (ConnectionRefusedError(111, "refused"), "connection"),
        (ConnectionResetError(104, "reset"), "connection"),
        (RedisTimeoutError("Timeout reading from socket"), "timeout"),
        (TimeoutError(), "timeout"),  # asyncio.timeout around a call: before OSError
        (BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
        (MasterNotFoundError("No master found for 'm'"), "failover"),
        (AsyncMasterNotFound("No master found for 'm'"), "failover"),
        (ClusterDownError("The cluster is down"), "failover"),
        (MasterDownError("Link with MASTER is down"), "failover"),
        (TryAgainError("Multiple keys request during rehashing of slot"), "failover"),
        (SlotNotCoveredError("slot 7 not covered"), "failover"),
        (ReadOnlyError("You can't write against a read only replica."), "readonly"),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "oom"),
        (ResponseError("MISCONF Redis is configured to save RDB snapshots"), "misconf"),
        (ResponseError("NOREPLICAS Not enough good replicas to write."), "noreplicas"),
        (NotReplicated("1 of 2 replicas acknowledged"), "noreplicas"),
        (ResponseError("BUSY Redis is busy running a script."), "busy"),
        (AuthenticationError("invalid username-password pair"), "auth"),
        (NoPermissionError("this user has no permissions to run the 'xadd' command"), "auth"),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), "other"),
        (NoScriptError("No matching script."), "other"),
        (ValueError("a reply that did not parse"), "other"),
    ],
)
def test_each_failure_has_its_kind(exc: BaseException, kind: str) -> None:
    assert error_kind(exc) == kind
    assert kind in KINDS


def test_kinds_are_distinct_label_values() -> None:
    assert len(set(KINDS)) == len(KINDS)
    assert all(kind.isidentifier() and kind.islower() for kind in KINDS)


@pytest.mark.parametrize(
    "text",
    [
        "NOREPLICAS Not enough good replicas to write.",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist",
    ],
)
def test_write_refusals_without_a_class_are_outages_to_ride_out(text: str) -> None:
    # (a producer gave up at once on NOREPLICAS: min-replicas-to-write with a replica away)
    assert unavailable(ResponseError(text))
    assert not unavailable(ResponseError("WRONGTYPE Operation against a key"))
