"""SharedSnapshot: one build per TTL, concurrent callers share it."""

from __future__ import annotations

import asyncio
import json

from pipeline.runtime.snapshot import SharedSnapshot


async def test_concurrent_callers_share_one_build_and_a_stale_one_is_rebuilt() -> None:
    builds = 0
    release = asyncio.Event()

    async def build() -> dict[str, int]:
        nonlocal builds
        builds += 1
        await release.wait()
        return {"n": builds}

    snap = SharedSnapshot(build, ttl_s=0.05)
    callers = [asyncio.ensure_future(snap.get()) for _ in range(50)]
    await asyncio.sleep(0)
    release.set()
    bodies = await asyncio.gather(*callers)
    assert builds == 1 and {json.loads(b)["n"] for b in bodies} == {1}
    assert json.loads(await snap.get()) == {"n": 1}  # still fresh
    deadline = asyncio.get_running_loop().time() + 5
    while json.loads(await snap.get())["n"] == 1:  # stale after the TTL: rebuilt
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert builds == 2
