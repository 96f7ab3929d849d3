"""Producers: the Redis stream producer, the hub, the mux (in-process mode) and its failure report;
``sluice produce`` going on from a stream's head."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from functools import partial

import redis
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, decode_block
from pipeline.chain.produce.generator import GENESIS_PARENT, SyntheticChain
from pipeline.chain.produce.producer import MuxProducer, RedisStreamProducer, WebsocketHub
from pipeline.chain.serve.server import HUB
from pipeline.errors import ChainError, MuxError
from tests.integration.lake.helpers import append_blocks
from tests.integration.lake.helpers import chain as lake_chain

from .conftest import STREAM


class Failing:
    def __init__(self, name: str) -> None:
        self.name = name

    async def send(self, block: Block) -> None:
        raise ChainError(f"{self.name} is down")

    async def close(self) -> None:
        return None


async def test_mux_reports_every_failure_and_still_sends_to_the_others(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    block = SyntheticChain(seed=51).take(1)[0]
    mux = MuxProducer(
        [("a", Failing("a")), ("redis", RedisStreamProducer(client, STREAM)), ("b", Failing("b"))]
    )
    try:
        await mux.send(block)
    except MuxError as exc:
        assert [name for name, _ in exc.failures] == ["a", "b"]
        assert "a is down" in str(exc) and "b is down" in str(exc)
    else:
        raise AssertionError("MuxError expected")
    entries = await client.xrange(keys.stream(STREAM))
    assert [decode_block(f[ENTRY_FIELD]) for _, f in entries] == [block]
    await client.aclose()


async def test_in_process_mode_through_the_mux(settings, serve, connect, redis_url: str) -> None:
    gen = SyntheticChain(seed=52)
    hub = WebsocketHub()
    client = aioredis.Redis.from_url(redis_url)
    mux = MuxProducer([("redis", RedisStreamProducer(client, STREAM)), ("websocket", hub)])
    for block in gen.take(5):
        await mux.send(block)
    async with serve(settings, relay=False, hub=hub) as (base, app), connect(base) as sub:
        assert app[HUB] is hub
        await sub.subscribe(0, gen.canonical[0].hash)
        got = await sub.blocks(5)
        for block in gen.take(10):
            await mux.send(block)
        got += await sub.blocks(10)
    await mux.close()
    assert got == gen.canonical[:15]
    assert hub.published == 15


def test_produce_continuing_a_long_stream_reorgs_at_the_right_heights(
    settings, redis_client: redis.Redis
) -> None:
    """``sluice produce`` twice on one stream: 300 blocks, then reorgs going on from the head
    (more entries than it reads back before). Every entry is one above its parent, an earlier
    entry; no reorg goes deeper than ``--reorg-depth`` below the head it replaces."""
    stream, depth = "chain:resume-reorgs", 5
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_SERVE_STREAM": stream,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    produce = [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0"]
    for args in (
        ["--count", "300", "--reorg-every", "0"],
        ["--count", "60", "--reorg-every", "3", "--reorg-depth", str(depth), "--seed", "1"],
    ):
        done = subprocess.run(
            [*produce, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
    assert "going on from its head, block 299" in done.stderr, done.stderr
    reorgs = int(done.stdout.split("(")[1].split(" reorgs")[0])
    assert reorgs >= 5, done.stdout

    seen: dict[bytes, Block] = {}
    prev: Block | None = None  # the last entry: the head the producer had when it wrote the next
    replaced = []
    for _, fields in redis_client.xrange(keys.stream(stream)):
        block = decode_block(fields[ENTRY_FIELD])
        if prev is None:
            assert (block.num, block.parent) == (0, GENESIS_PARENT)
        else:
            parent = seen.get(block.parent)
            assert parent is not None, f"block {block.num}: its parent is no earlier entry"
            assert block.num == parent.num + 1, (
                f"block {block.num} written as the child of {parent.num}"
            )
            if parent is not prev:  # a reorg: replaces prev.num - parent.num blocks below prev
                replaced.append(prev.num - parent.num)
        seen[block.hash] = prev = block
    assert len(replaced) == reorgs and min(replaced) >= 1 and max(replaced) <= depth, replaced
    assert prev is not None and max(seen.values(), key=lambda b: b.weight or 0) is prev

    # deeper than the 256 entries first read back: it reads on, to the stream's start here
    deep = subprocess.run(
        [*produce, "--count", "1", "--reorg-every", "1", "--reorg-depth", "1000"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert f"at most {prev.num} below the head" in deep.stderr, deep.stderr
    assert f"link blocks 0..{prev.num} only" in deep.stderr, deep.stderr


def test_produce_refuses_to_start_a_new_chain_on_a_stream_trimmed_empty(
    settings, redis_client: redis.Redis
) -> None:
    """The lake jobs trimmed the stream empty: its chain goes on in the lake, which produce does
    not read. ``sluice produce`` refuses in one line (it wrote a new chain from block 0, lighter
    than the lake's, found by the history checker) unless told ``--from-genesis``."""
    stream = "chain:trimmed"
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_SERVE_STREAM": stream,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    produce = [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0", "--count", "5"]
    run = partial(subprocess.run, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run(produce).returncode == 0
    redis_client.xtrim(keys.stream(stream), maxlen=0)
    refused = run(produce)
    assert refused.returncode == 2 and redis_client.xlen(keys.stream(stream)) == 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "trimmed empty" in lines[0] and "--from-genesis" in lines[0]
    assert run([*produce, "--from-genesis"]).returncode == 0
    assert redis_client.xlen(keys.stream(stream)) == 5


def test_produce_refuses_a_new_chain_where_redis_lost_a_stream_the_lake_holds(
    settings, redis_client: redis.Redis, lake_uri: str
) -> None:
    """The neighbour of the stream trimmed empty: Redis lost its data (FLUSHALL, a restart
    without persistence), so nothing in Redis says the stream ever was. Its chain is in the
    lake: a new chain from block 0 would be lighter than the lake's, never canonical.
    ``sluice produce`` refuses in one line that names the lake's head, unless told
    ``--from-genesis``; a stream the lake does not hold starts as before."""
    stream = "chain:wiped"
    append_blocks(lake_uri, stream, lake_chain(0, 12))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": lake_uri,
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    produce = [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0", "--count", "3"]
    run = partial(subprocess.run, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert redis_client.exists(keys.stream(stream)) == 0
    refused = run([*produce, "--stream", stream])
    assert refused.returncode == 2 and redis_client.exists(keys.stream(stream)) == 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "not in Redis" in lines[0] and "up to block 11" in lines[0], lines[0]
    assert "--from-genesis" in lines[0]
    told = run([*produce, "--stream", stream, "--from-genesis"])
    assert told.returncode == 0, told.stderr
    assert redis_client.xlen(keys.stream(stream)) == 3
    other = run([*produce, "--stream", "chain:new"])  # the lake has none of it: a new chain
    assert other.returncode == 0, other.stderr
    assert redis_client.xlen(keys.stream("chain:new")) == 3


def test_produce_starts_a_new_stream_when_the_lake_cannot_be_read(
    settings, redis_client: redis.Redis
) -> None:
    """The lake's head is only asked to refuse: a store that does not answer costs one warning
    with its cause, and a new stream starts as it always did."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": "s3://nowhere/lake",
        "SLUICE_LAKE_S3_ENDPOINT": f"http://127.0.0.1:{port}",
        "SLUICE_LAKE_S3_ALLOW_HTTP": "true",
        "SLUICE_LAKE_S3_ACCESS_KEY": "a",
        "SLUICE_LAKE_S3_SECRET_KEY": "b",
        "SLUICE_LAKE_S3_TIMEOUT_S": "2",
        "SLUICE_LAKE_S3_MAX_RETRIES": "0",
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    stream = "chain:lake-down"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0", "--count", "2",
         "--stream", stream],
        env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert redis_client.xlen(keys.stream(stream)) == 2
    warned = [line for line in done.stderr.splitlines() if "could not be read" in line]
    assert len(warned) == 1 and stream in warned[0], done.stderr
