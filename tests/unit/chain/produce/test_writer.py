"""The producer's block writer against a real redis-server: idempotent appends, outages ridden
out and recorded (kind, cause, ridden out), faults not retried, and a bounded wait."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.exceptions import ResponseError

from pipeline import keys
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.produce.writer import BlockWriter
from pipeline.errors import ProducerGaveUp, RedisUnavailable
from tests.support.poll import until
from tests.support.refusal import noreplicas

STREAM = "chain:writer"


async def test_a_repeated_append_is_written_once(redis_url: str, redis_client: redis.Redis) -> None:
    block = SyntheticChain(seed=5).take(1)[0]
    writer = BlockWriter(redis_url, STREAM, retry_for=5.0)
    try:
        assert await writer.append(block) is False
        assert await writer.append(block) is False  # a retry whose first answer was lost
    finally:
        await writer.close()
    assert redis_client.xlen(keys.stream(STREAM)) == 1
    assert (writer.record.written, writer.record.retries) == (2, 0)


async def test_a_write_refusal_is_ridden_out_and_recorded(redis_factory) -> None:
    server = redis_factory()
    blocks = SyntheticChain(seed=6).take(2)
    writer = BlockWriter(server.url, STREAM, retry_for=60.0)
    try:
        await writer.append(blocks[0])
        with noreplicas(server.url):
            pending = asyncio.create_task(writer.append(blocks[1]))
            await until(lambda: writer.record.retries >= 2, "retried")
            with pytest.raises(RedisUnavailable, match="writing block 1 has failed .*NOREPLICAS"):
                await writer.record.check()
            assert not pending.done()
        assert await asyncio.wait_for(pending, 10) is True  # an outage ridden out
        await writer.record.check()
    finally:
        await writer.close()
    record = writer.record
    assert (record.written, record.outages, record.ridden_out) == (2, 1, 1)
    assert record.errors["noreplicas"] == record.retries >= 2
    with redis.Redis.from_url(server.url) as client:
        assert client.xlen(keys.stream(STREAM)) == 2


async def test_a_refusal_longer_than_retry_for_gives_up(redis_factory) -> None:
    server = redis_factory()
    writer = BlockWriter(server.url, STREAM, retry_for=0.3)
    try:
        with noreplicas(server.url), pytest.raises(ProducerGaveUp, match="NOREPLICAS"):
            await writer.append(SyntheticChain(seed=7).take(1)[0])
    finally:
        await writer.close()


async def test_a_fault_of_the_command_is_not_retried(redis_url: str, redis_client) -> None:
    redis_client.set(keys.stream(STREAM), b"not a stream")
    writer = BlockWriter(redis_url, STREAM, retry_for=60.0)
    try:
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await writer.append(SyntheticChain(seed=8).take(1)[0])
    finally:
        await writer.close()
    assert (writer.record.retries, writer.record.outages) == (0, 0)
