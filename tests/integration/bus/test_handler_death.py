"""A handler that dies mid-call (its process ends with ``os._exit``) does not lose the
call (issue 31, item 3): another handler gets it again, and sees that it is a
redelivery; a request whose handlers died three times is set aside in the dead-letter
list and its caller answered "handler failed", not left to wait for its ``exp``.

Real buses and Redis; the handlers are real processes
(:mod:`tests.integration.bus.handler_proc`) that die for real.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import dead
from pipeline.errors import RemoteError

from .conftest import ROOT

pytestmark = pytest.mark.timeout(90)

#: The handlers' TTL: a dead one's requests are handed on within about this long.
TTL_S = 1.0
#: The calls' exp: far longer than the tests take (a lost call would wait for it).
EXP_S = 60


@pytest.fixture
def handlers(tmp_path: Path) -> Iterator[Callable[[str, str], subprocess.Popen[bytes]]]:
    """Starts handler processes (``start(redis_url, die)``); kills what is left at the end."""
    made: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.pop("PYTHONASYNCIODEBUG", None)

    def start(url: str, die: str) -> subprocess.Popen[bytes]:
        args = [
            sys.executable, "-m", "tests.integration.bus.handler_proc", "--redis", url,
            "--log", str(tmp_path / "runs.jsonl"), "--die", die, "--ttl", str(TTL_S),
        ]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, cwd=ROOT, env=env)
        made.append(proc)
        assert proc.stdout is not None
        assert b"handler serving" in proc.stdout.readline()
        return proc

    yield start
    for proc in made:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _runs(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]


async def _died(proc: subprocess.Popen[bytes]) -> None:
    assert await asyncio.to_thread(proc.wait, 30) == 3  # os._exit mid-call


async def test_a_call_whose_handler_died_is_handed_to_another(twins, handlers, tmp_path):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    first = handlers(b.url, "first")  # dies in the middle of the call
    call = asyncio.create_task(a.client().call("work", dst=[b.id], data="x", exp=EXP_S))
    await _died(first)
    handlers(b.url, "never")
    assert await asyncio.wait_for(call, 30) == [b"done:x"]
    runs = _runs(tmp_path)
    assert [run["redelivered"] for run in runs] == [0, 1], runs  # the second knows
    assert len({run["uid"] for run in runs}) == 1 and runs[0]["pid"] != runs[1]["pid"]


async def test_a_call_whose_handlers_keep_dying_is_set_aside_and_answered(
    twins, handlers, tmp_path
):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    call = asyncio.create_task(a.client().call("work", dst=[b.id], data="x", exp=EXP_S))
    for _ in range(dead.MAX_ATTEMPTS):
        await _died(handlers(b.url, "always"))
    handlers(b.url, "never")  # finds the third death: sets it aside, answers its caller
    with pytest.raises(RemoteError, match="handler failed: it died"):
        await asyncio.wait_for(call, 30)
    assert [run["redelivered"] for run in _runs(tmp_path)] == [0, 1, 2]
    rb = aioredis.Redis.from_url(b.url)
    try:
        [entry] = [dead.parse(raw) for raw in await rb.lrange(keys.bus_dead(), 0, -1)]
        assert entry.queue == keys.bus_command("work") and "died" in entry.reason
        assert await rb.llen(keys.bus_command("work")) == 0
        assert not await rb.exists(keys.bus_redelivered())
    finally:
        await rb.aclose()
