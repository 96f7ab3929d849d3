"""The releaser's policy: give back while above the floor, back off when it gives nothing."""

from __future__ import annotations

import asyncio
import gc
import weakref

from pipeline.runtime import memory
from tests.support.poll import until

MB = 1 << 20


class Process:
    """A resident size the test moves, and what a release would give back."""

    def __init__(self, rss: int) -> None:
        self.rss = rss
        self.frees = 0  # bytes the next release gives back
        self.releases = 0

    def give_back(self) -> None:
        self.releases += 1
        self.rss -= self.frees


async def test_growth_under_the_threshold_is_left_alone() -> None:
    proc = Process(200 * MB)
    rel = memory.Releaser(growth_bytes=32 * MB, measure=lambda: proc.rss, give_back=proc.give_back)
    proc.rss += 31 * MB
    assert not await rel.check() and proc.releases == 0


async def test_it_keeps_releasing_until_back_near_the_floor() -> None:
    proc = Process(200 * MB)
    told: list[tuple[int, int]] = []
    rel = memory.Releaser(
        growth_bytes=32 * MB,
        measure=lambda: proc.rss,
        give_back=proc.give_back,
        on_release=lambda b, a: told.append((b, a)),
    )
    proc.rss = 400 * MB  # subscribers catching up: a release gives little
    proc.frees = 2 * MB
    assert await rel.check()
    proc.frees = 150 * MB  # they left: the next release gives back the rest
    assert await rel.check()
    assert proc.rss == 248 * MB and told == [(400 * MB, 398 * MB), (398 * MB, 248 * MB)]
    proc.frees = 0
    assert await rel.check()  # still 48 MB above the 200 MB floor: tried again
    assert rel.wait_s == 20  # nothing came back: it backs off


async def test_fruitless_releases_back_off_and_a_fruitful_one_resets() -> None:
    proc = Process(100 * MB)
    rel = memory.Releaser(
        every_s=10, growth_bytes=32 * MB, measure=lambda: proc.rss, give_back=proc.give_back
    )
    proc.rss = 500 * MB  # a cache that really filled: nothing to give back
    waits = []
    for _ in range(6):
        await rel.check()
        waits.append(rel.wait_s)
    assert waits == [20, 40, 80, 160, 160, 160]
    proc.frees = 300 * MB
    await rel.check()
    assert rel.wait_s == 10 and proc.rss == 200 * MB


async def test_pruning_releases_at_once_whatever_the_backoff() -> None:
    """A cache that was full and then dropped its idle entries (``prune``) is given back
    on the next tick, not after the backoff its fruitless releases built up."""
    proc = Process(100 * MB)
    cache = {"entries": 0}

    def prune() -> int:
        dropped, cache["entries"] = cache["entries"], 0
        proc.frees = dropped * MB
        return dropped

    rel = memory.Releaser(
        every_s=0.01,
        growth_bytes=32 * MB,
        measure=lambda: proc.rss,
        give_back=proc.give_back,
        prune=prune,
    )
    proc.rss = 500 * MB  # a cache that really filled: releases give nothing
    for _ in range(5):
        await rel.check()
    assert rel.wait_s == 0.16  # backed off
    task = asyncio.create_task(rel.run())
    try:
        releases = proc.releases
        cache["entries"] = 400  # then went idle and is dropped
        await until(lambda: proc.rss, "given back", within_s=30, accept=lambda r: r == 100 * MB)
        assert proc.releases == releases + 1 and rel.wait_s == 0.01
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_last_client_leaving_makes_a_check_due_whatever_the_backoff() -> None:
    """Releases made while clients held their memory gave nothing and backed off (to 16
    times the period); once the last one left, the next check is due at once."""
    proc = Process(100 * MB)
    rel = memory.Releaser(
        every_s=10, growth_bytes=32 * MB, measure=lambda: proc.rss, give_back=proc.give_back
    )
    proc.rss = 900 * MB  # the clients' buffers: a release gives nothing while they stay
    for _ in range(5):
        await rel.check()
    assert rel.wait_s == 160
    assert rel.due_after(False, now=1000.0, due=1160.0) == 1160.0  # clients connected
    assert rel.due_after(False, now=1010.0, due=1160.0) == 1160.0
    assert rel.due_after(True, now=1020.0, due=1160.0) == 1020.0  # the last one left
    assert rel.wait_s == 10
    assert rel.due_after(True, now=1030.0, due=1040.0) == 1040.0  # still idle: no change


def test_release_and_rss_work_on_this_machine() -> None:
    memory.release()
    assert memory.rss_bytes() > 0


_SHOW = (
    "import os, sys; from pipeline.runtime import memory; print(os.getpid(), flush=True); "
    "memory.system_malloc(); print(os.getpid(), os.environ.get('PYTHONMALLOC'), sys.argv[1:])"
)


def test_system_malloc_runs_the_process_again_on_malloc_unless_set() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    out = subprocess.run(
        [sys.executable, "-c", _SHOW, "serve", "--port", "1"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split("\n")  # fmt: skip
    # printed once before the exec and twice after: the same pid, the same arguments
    pid = out[0]
    assert out[1] == pid and out[2] == f"{pid} malloc ['serve', '--port', '1']", out
    kept = subprocess.run(
        [sys.executable, "-c", _SHOW],
        env={**env, "PYTHONMALLOC": "pymalloc"}, capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout.split("\n")  # fmt: skip
    assert kept[1] == f"{kept[0]} pymalloc []", kept  # the operator's choice: no exec


async def test_cyclic_garbage_is_collected_before_a_release() -> None:
    # A server with raised gc thresholds (sluice serve) keeps unreachable cycles for long;
    # what they hold can only be given back once they are collected.
    class Node:
        def __init__(self) -> None:
            self.me = self
            self.payload = bytearray(MB)

    proc = Process(200 * MB)
    proc.frees = 40 * MB
    order: list[str] = []

    def give_back() -> None:
        order.append("release")
        proc.give_back()

    rel = memory.Releaser(growth_bytes=32 * MB, measure=lambda: proc.rss, give_back=give_back)
    thresholds = gc.get_threshold()
    gc.disable()  # no automatic collection: only the releaser's can free the cycle
    try:
        node = Node()
        gone = weakref.ref(node)
        del node
        assert gone() is not None  # a cycle: reference counting alone keeps it
        proc.rss += 40 * MB
        assert not order and await rel.check()
        assert gone() is None and order == ["release"]
        # under the threshold nothing is collected (a check is cheap when nothing is due)
        node = Node()
        gone = weakref.ref(node)
        del node
        assert not await rel.check() and gone() is not None
        # clients connected (not idle): the release goes on, without the collection's pause
        clients = [object()]
        busy = memory.Releaser(
            growth_bytes=32 * MB,
            measure=lambda: proc.rss,
            give_back=give_back,
            idle=lambda: not clients,
        )
        proc.rss += 40 * MB
        assert await busy.check() and order == ["release", "release"]
        assert gone() is not None
        clients.clear()
        proc.rss += 40 * MB
        assert await busy.check() and gone() is None
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
        gc.collect()
