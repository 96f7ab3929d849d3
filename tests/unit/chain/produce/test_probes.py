"""The producer's write record: counts for /metrics, the outage under way for /healthz."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError

from pipeline.chain.produce.probes import WriteRecord, samples
from pipeline.errors import RedisUnavailable
from pipeline.redisio.errorkind import KINDS
from pipeline.runtime.health import render


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_counted_once_and_ridden_out_once() -> None:
    clock = Clock()
    record = WriteRecord(clock)
    assert record.succeeded() is False  # nothing was failing
    assert record.failed(RedisConnectionError("refused"), "writing block 3") == 0.0
    clock.now += 1.5
    assert record.failed(ReadOnlyError("You can't write against a read only replica."), "x") == 1.5
    assert (record.retries, record.outages, record.ridden_out) == (2, 1, 0)
    assert record.errors == {"connection": 1, "readonly": 1}
    assert record.failing_s == 1.5
    assert record.succeeded() is True
    assert (record.outages, record.ridden_out, record.failing_s) == (1, 1, 0.0)
    record.failed(ResponseError("NOREPLICAS Not enough good replicas to write."), "writing block 4")
    assert (record.outages, record.errors["noreplicas"]) == (2, 1)


def test_the_check_fails_with_the_cause_while_writes_fail() -> None:
    clock = Clock()
    record = WriteRecord(clock)
    asyncio.run(record.check())  # healthy: returns
    record.failed(ReadOnlyError("You can't write against a read only replica."), "writing block 9")
    clock.now += 2.25
    with pytest.raises(RedisUnavailable) as caught:
        asyncio.run(record.check())
    assert str(caught.value) == (
        "writing block 9 has failed for 2.2s, retrying: "
        "ReadOnlyError: You can't write against a read only replica."
    )
    record.succeeded()
    asyncio.run(record.check())


def test_samples_name_every_figure_and_every_kind() -> None:
    record = WriteRecord(Clock())
    record.written = 41
    record.failed(ResponseError("MISCONF Redis is configured to save RDB snapshots"), "w")
    record.succeeded()
    text = render(samples(record, reorgs=3, head=40))
    for line in (
        "sluice_produce_blocks_written_total 41",
        "sluice_produce_reorgs_total 3",
        "sluice_produce_retries_total 1",
        "sluice_produce_outages_total 1",
        "sluice_produce_outages_ridden_out_total 1",
        "sluice_produce_failing_seconds 0",
        "sluice_produce_head_block 40",
        'sluice_produce_redis_errors_total{kind="misconf"} 1',
        'sluice_produce_redis_errors_total{kind="oom"} 0',
    ):
        assert line in text.splitlines(), (line, text)
    assert text.count("sluice_produce_redis_errors_total{") == len(KINDS)
    assert "# TYPE sluice_produce_blocks_written_total counter" in text
    assert "head_block" not in render(samples(record, reorgs=0, head=None))
