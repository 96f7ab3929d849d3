"""The CLIs: sluice produce into Redis, sluice serve in a process, sluice subscribe printing updates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import redis

from pipeline import keys
from pipeline.errors import StreamKindError
from pipeline.runtime.ports import free_port

from .conftest import STREAM


def test_produce_serve_subscribe(settings, redis_client: redis.Redis) -> None:
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": settings.lake.uri,
        "SLUICE_SERVE_STREAM": STREAM,
        "SLUICE_CHAIN_STREAMS": STREAM,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    produced = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0", "--count", "12"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "produced 12 blocks" in produced.stdout
    assert redis_client.xlen(keys.stream(STREAM)) == 12
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port)], env=env
    )
    try:
        url = f"ws://127.0.0.1:{port}/ws"
        deadline = time.monotonic() + 30
        while True:
            sub = subprocess.run(
                [sys.executable, "-m", "pipeline.cli", "subscribe", "--url", url, "--count", "12"],
                env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if sub.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert sub.returncode == 0, sub.stderr
        lines = [json.loads(line) for line in sub.stdout.splitlines()]
        assert [line["added"] for line in lines] == list(range(12))
        bad = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "subscribe", "--url", url, "--hash", "0x12"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert bad.returncode != 0 and "--hash" in bad.stderr
    finally:
        server.terminate()
        assert server.wait(20) == 0


def test_produce_goes_on_from_the_streams_head(settings, redis_client: redis.Redis) -> None:
    from pipeline.blockcodec import ENTRY_FIELD, decode_block
    from pipeline.chain.tailindex import TailIndex

    env = {
        **os.environ,
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_SERVE_STREAM": STREAM,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    produce = [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "0", "--count", "30",
               "--reorg-every", "7", "--reorg-depth", "3"]  # fmt: skip
    first = subprocess.run(produce, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert "going on" not in first.stderr  # an empty stream: from block 0
    again = subprocess.run(produce, env=env, capture_output=True, text=True, timeout=60, check=True)
    tail = TailIndex()
    for entry_id, fields in redis_client.xrange(keys.stream(STREAM)):
        b = decode_block(fields[ENTRY_FIELD])
        tail.add(b.num, b.hash.hex(), b.parent.hex(), entry_id, b.weight)
    head = max(tail.chain)
    assert "going on from its head" in again.stderr, again.stderr
    assert sorted(tail.chain) == list(range(head + 1))  # one chain from 0, no second genesis
    for num in range(1, head + 1):
        assert tail.chain[num][1] == tail.chain[num - 1][0]  # parent-linked across both runs
    assert len(tail.seen) == redis_client.xlen(keys.stream(STREAM))  # no hash written twice
    assert (
        "default: 100"
        in subprocess.run(
            [*produce[:4], "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )


def _serve_refusal(settings, *args: str, **env: str) -> str:
    """Run ``sluice serve`` expecting a refusal at start; its one line."""
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": settings.lake.uri,
        "SLUICE_CONFIG": os.devnull,
        "SLUICE_LOG_LEVEL": "WARNING",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "serve", "--port", str(free_port()), *args],
        env=full, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_serve_refuses_a_stream_the_setting_does_not_name(settings, redis_client) -> None:
    from tests.integration.lake.helpers import chain, publish

    publish(redis_client, "chain:s1", chain(0, 5))
    line = _serve_refusal(settings, "--stream", "chain:s1", SLUICE_CHAIN_STREAMS="chain:demo")
    assert line.startswith("sluice serve: stream 'chain:s1' is not a chain stream"), line
    assert "SLUICE_CHAIN_STREAMS (chain:demo)" in line and "lake" in line


def test_serve_refuses_a_declared_stream_whose_entries_are_not_blocks(
    settings, redis_client
) -> None:
    for n in range(3):
        redis_client.xadd(keys.stream("events:1"), {b"n": str(n).encode()})
    line = _serve_refusal(settings, SLUICE_SERVE_STREAM="events:1", SLUICE_CHAIN_STREAMS="events*")
    assert line.startswith("sluice serve: stream 'events:1' is a chain stream"), line
    assert "SLUICE_CHAIN_STREAMS (events*)" in line and "not blocks" in line


def test_serve_starts_on_a_declared_stream_with_redis_down(settings) -> None:
    from pipeline.chain.serve.cli import check_stream

    down = settings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0", chain_streams=(STREAM,))
    check_stream(down)  # the entries cannot be looked at: not a reason to stay down
    with pytest.raises(StreamKindError, match="not a chain stream"):
        check_stream(down.replace(chain_streams=("chain:demo",)))
