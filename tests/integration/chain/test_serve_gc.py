"""``sluice serve`` leaves what start-up built out of the cyclic GC (``gc.freeze``).

A full collection walks every tracked object and stops the fan-out meanwhile: with
start-up's modules and app among them it took 90-550 ms on the 2-core machine
(``fanout_p99_ms`` of ``make bench B=resume``). Objects made later (connections,
blocks) are still collected.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from pipeline.chain import cli
from pipeline.ports import free_port
from tests.support.poll import until


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # the rest of the test run collects as before


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
