"""An entry that kills its consumer's process: after a bounded number of deaths it is
dead-lettered and the stream flows on, instead of a crash loop (real processes, real Redis)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import redis as sync_redis

from pipeline import keys

ROOT = Path(__file__).resolve().parents[3]
MAX_FAILURES = 2

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from pathlib import Path
    from pipeline.routing.node import Node
    from pipeline.streams.consumer import Consumer
    from pipeline.streams.service import StreamService
    from pipeline.streams.serviceredis import connect

    async def main(url: str, record: Path) -> None:
        node = Node("crashy")
        redis = connect(url)
        await node.add_worker("stream_service", StreamService(redis))

        async def handler(index: str, data: bytes) -> None:
            if data == b"die":
                os._exit(3)  # what no except clause can catch
            with record.open("ab") as f:
                f.write(data + b"\\n")

        consumer = Consumer(
            "crashy", handler, client_id="c", holder="h", wait_ms=100,
            max_failures=MAX_FAILURES, lease_ttl_ms=2000,
        )
        await node.add_worker("consumer", consumer)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b"last" not in record.read_bytes():
            await asyncio.sleep(0.05)
        await node.stop()
        await redis.aclose()

    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
    """
).replace("MAX_FAILURES", str(MAX_FAILURES))


def test_a_process_killing_entry_is_dead_lettered_after_bounded_deaths(
    redis_url: str, redis_client: sync_redis.Redis, tmp_path: Path
) -> None:
    script = tmp_path / "consumer.py"
    script.write_text(SCRIPT)
    record = tmp_path / "handled.txt"
    record.write_bytes(b"")
    for data in (b"a", b"b", b"die", b"c", b"last"):
        redis_client.xadd(keys.stream("crashy"), {b"data": data})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONASYNCIODEBUG", None)
    codes = []
    for _ in range(3 * MAX_FAILURES + 2):
        run = subprocess.run(
            [sys.executable, str(script), redis_url, str(record)],
            env=env, cwd=tmp_path, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        codes.append(run.returncode)
        if run.returncode == 0:
            break
        assert run.returncode == 3, run.stderr.decode()
    assert codes[-1] == 0, codes
    assert len(codes) <= 2 * MAX_FAILURES + 1, codes  # bounded deaths, then it flows
    handled = record.read_bytes().splitlines()
    assert set(handled) == {b"a", b"b", b"c", b"last"}
    dead = redis_client.xrange(keys.dead_letter("crashy"))
    assert [fields[b"data"] for _, fields in dead] == [b"die"]
    assert b"died" in dead[0][1][b"reason"]
    assert redis_client.hlen(keys.failures("crashy")) == 0  # no counter left behind
