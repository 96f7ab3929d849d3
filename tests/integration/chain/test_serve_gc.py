"""``sluice serve`` leaves what start-up built out of the cyclic GC (``gc.freeze``).

A full collection walks every tracked object and stops the fan-out meanwhile: with
start-up's modules and app among them it took 90-550 ms on the 2-core machine
(``fanout_p99_ms`` of ``make bench B=resume``). Objects made later (connections,
blocks) are still collected.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from pipeline.chain.serve import cli
from pipeline.runtime.ports import free_port
from tests.support.poll import until


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()  # the rest of the test run collects as before
        gc.set_threshold(*thresholds)


async def test_serve_freezes_its_start_up_heap_and_still_collects_later_cycles(
    settings, unfrozen: None
) -> None:
    assert gc.get_freeze_count() == 0
    task = asyncio.create_task(cli.serve(settings.replace(serve_port=free_port())))
    try:
        frozen = await until(gc.get_freeze_count, "start-up's objects frozen", within_s=60)
        assert frozen > 10_000  # the modules and the app, not a handful

        class Cycle:
            pass

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        del a, b
        assert gc.collect() >= 2  # a cycle made after start-up is still collected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Node:
    other: object = None


def _collected_without_asking(ref: weakref.ref[_Node], limit: int) -> int | None:
    """Allocate (and keep) containers until ``ref`` dies by an automatic collection;
    how many it took, None if not within ``limit`` (what bounds a hang)."""
    kept: list[list[None]] = []
    for n in range(limit):
        kept.append([None])
        if ref() is None:
            return n
    return None


async def test_serve_raises_the_gc_thresholds_and_cycles_are_still_collected(
    settings, unfrozen: None
) -> None:
    """After start-up ``gc.set_threshold(*GC_THRESHOLDS)``: young collections and full ones
    are rarer (less CPU, fewer pauses of the fan-out), and a cycle, young or old, is
    still collected by the collector's own schedule."""
    task = asyncio.create_task(cli.serve(settings.replace(serve_port=free_port())))
    try:
        await until(gc.get_freeze_count, "start-up's objects frozen", within_s=60)
        assert gc.get_threshold() == cli.GC_THRESHOLDS
        assert cli.GC_THRESHOLDS[0] > 700  # (CPython's default)
        young = _Node()
        young.other = _Node()
        young.other.other = young  # type: ignore[attr-defined]
        young_ref = weakref.ref(young)
        del young
        assert _collected_without_asking(young_ref, 10 * cli.GC_THRESHOLDS[0]) is not None

        old = _Node()
        old.other = _Node()
        old.other.other = old  # type: ignore[attr-defined]
        old_ref = weakref.ref(old)
        gc.collect(1)  # reachable still: now in the oldest generation
        del old
        g0, g1, g2 = cli.GC_THRESHOLDS
        assert _collected_without_asking(old_ref, 20 * g0 * g1 * g2) is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
