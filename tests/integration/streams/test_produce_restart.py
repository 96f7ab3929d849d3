"""``sluice produce`` rides out a real redis-server restart: no traceback, no lost or doubled block."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, decode_block
from pipeline.local.redisserver import LocalRedis

ROOT = Path(__file__).resolve().parents[3]
STREAM = "chain:produce-restart"


def test_produce_survives_a_redis_restart(
    redis_factory: Callable[..., LocalRedis], tmp_path: Path
) -> None:
    server = redis_factory(aof=True)  # the entries written before the restart survive it
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": server.url,
        "SLUICE_SERVE_STREAM": STREAM,
        "PYTHONPATH": str(ROOT),
    }
    env.pop("PYTHONASYNCIODEBUG", None)
    count = 60
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "produce", "--rate", "40", "--count", str(count)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    key = keys.stream(STREAM)
    try:
        client = redis.Redis.from_url(server.url)
        deadline = time.monotonic() + 30
        while client.xlen(key) < 10:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "produce wrote nothing"
            time.sleep(0.02)
        client.close()
        server.stop()
        time.sleep(1.0)  # an outage of a second, with the producer retrying
        assert proc.poll() is None, "produce died while redis was down"
        server.start()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert f"produced {count} blocks" in out and "1 redis outage(s)" in out
    outage_lines = [line for line in err.splitlines() if "redis unavailable" in line]
    assert len(outage_lines) == 1, err
    client = redis.Redis.from_url(server.url)
    try:
        nums = [decode_block(fields[ENTRY_FIELD]).num for _, fields in client.xrange(key)]
    finally:
        client.close()
    assert nums == list(range(nums[0], nums[0] + count)), nums
