"""The endpoints' shared state: a Redis failure behind a 503 is logged through the one
gate (once per interval, once when Redis works again), with its traceback only when it
is not "Redis away or refusing writes"; every one is counted."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from pipeline.bus.config import BusConfig
from pipeline.bus.directory import FileDirectory
from pipeline.bus.ingress import Ingress


def _ingress() -> Ingress:
    config = BusConfig(twin=1001, listen="127.0.0.1:0")
    return Ingress.from_config(config, FileDirectory({}), store=None)  # type: ignore[arg-type]


def test_redis_away_is_one_line_until_it_works_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pipeline.bus.http")
    ing = _ingress()
    for _ in range(42):
        ing.redis_failed(RedisConnectionError("Connection refused"))
    ing.redis_works()
    ing.redis_works()  # nothing was failing: nothing said
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "answering 503" in said[0] and "works again" in said[1]
    assert ing.counts["redis_errors"] == 42


def test_a_redis_fault_that_is_not_an_outage_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pipeline.bus.http")
    ing = _ingress()
    try:
        raise ResponseError("ERR unknown command")
    except ResponseError as exc:
        ing.redis_failed(exc)
        ing.redis_failed(exc)
    assert [r.exc_info is not None for r in caplog.records] == [True, True]


def test_the_answered_hook_is_passed_on() -> None:
    told: list[list[str]] = []
    config = BusConfig(twin=1001, listen="127.0.0.1:0")
    ing = Ingress.from_config(config, FileDirectory({}), None, told.append)  # type: ignore[arg-type]
    assert ing.answered is not None
    ing.answered(["1002.5"])
    assert told == [["1002.5"]]
