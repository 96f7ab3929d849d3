"""The CLIs: sluice produce into Redis, sluice serve in a process, sluice subscribe printing updates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import redis

from pipeline import keys
from pipeline.ports import free_port

from .conftest import STREAM


def test_produce_serve_subscribe(settings, redis_client: redis.Redis) -> None:
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": settings.lake.uri,
        "SLUICE_SERVE_STREAM": STREAM,
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
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if sub.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert sub.returncode == 0, sub.stderr
        lines = [json.loads(line) for line in sub.stdout.splitlines()]
        assert [line["added"] for line in lines] == list(range(12))
        bad = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "subscribe", "--url", url, "--hash", "0x12"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert bad.returncode != 0 and "--hash" in bad.stderr
    finally:
        server.terminate()
        assert server.wait(20) == 0
