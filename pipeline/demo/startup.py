"""Starting the demo's components and its traffic: shared by the live view and the check.

Both :mod:`pipeline.demo.app` (live) and :mod:`pipeline.demo.check` (the
scripted scenario) start every component the same way; this module is below
both, so neither imports the other for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pipeline.demo.activity import Activity
from pipeline.demo.plan import Plan
from pipeline.demo.procs import MARKER
from pipeline.demo.supervisor import Supervisor
from pipeline.errors import DemoError

#: Seconds the Spark warm-up may take before it is abandoned.
WARM_TIMEOUT_S = 300.0
#: Seconds the traffic and watch tasks get to end once cancelled (Ctrl-C) before the
#: components are stopped anyway.
CANCEL_WAIT_S = 10.0


def progress_bar() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),
        TimeElapsedColumn(),
        transient=False,
    )


async def start_all(
    supervisor: Supervisor,
    progress: Progress,
    stop: asyncio.Event,
    event: Callable[[str], None],
    warm: Callable[[], Awaitable[float]] | None = None,
) -> float:
    """Redis first, then every other component at once; seconds until all are up.

    Raises :class:`DemoError` (the first component that failed) or returns
    early with ``stop`` set on Ctrl-C.
    """
    t0 = time.monotonic()
    tasks = {name: progress.add_task(f"{name}: starting", total=1) for name in supervisor.children}

    async def one(name: str) -> None:
        child = await supervisor.start(name)
        progress.update(
            tasks[name], completed=1, description=f"{name}: up in {child.up_after_s:.1f}s"
        )
        event(f"{name} up in {child.up_after_s:.1f}s")
        if name == "spark" and warm is not None:
            step = progress.add_task("spark: warming Delta (first write)", total=1)
            took = await warm()
            progress.update(step, completed=1, description=f"spark: warm in {took:.1f}s")

    first = [n for n in ("redis", "postgres", "s3") if n in supervisor.children]
    await asyncio.gather(*(one(n) for n in first))  # what the others connect to
    rest = [n for n in supervisor.children if n not in first]
    starting: asyncio.Future[Any] = asyncio.gather(*(one(n) for n in rest))
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([starting, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, DemoError):
            await starting
        return time.monotonic() - t0
    starting.result()  # raises the first DemoError
    return time.monotonic() - t0


def warmer(plan: Plan, event: Callable[[str], None]) -> Callable[[], Awaitable[float]]:
    """Run :mod:`pipeline.demo.warm` against the demo's Connect server; seconds it took.

    A failure is reported, not fatal: the first archive run is then only slower.
    """

    async def warm() -> float:
        started = time.monotonic()
        log = plan.dir / "spark-warm.log"
        with log.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pipeline.demo.warm", plan.spark_url,
                str(plan.dir / "warm" / "delta"),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                env={**os.environ, **plan.sluice_env(), MARKER: plan.demo_id},
                start_new_session=True,
            )  # fmt: skip
            try:
                async with asyncio.timeout(WARM_TIMEOUT_S):
                    code = await proc.wait()
            except TimeoutError:
                proc.kill()
                code = await proc.wait()
        if code != 0:
            event(f"warming Spark failed (code {code}, log {log}); the first archive is slower")
        return time.monotonic() - started

    return warm


@contextlib.asynccontextmanager
async def running(activity: Activity, supervisor: Supervisor) -> AsyncIterator[None]:
    """The demo's traffic and the supervisor's watch, cancelled and awaited on exit.

    Awaited at most :data:`CANCEL_WAIT_S`: Ctrl-C must reach the components whatever a
    task does with its cancellation (a CI run saw a Ctrl-C that stopped nothing for 60 s,
    no "stopping every component" line, right after a component's restart).
    """
    tasks = [
        asyncio.create_task(activity.run(), name="activity"),
        asyncio.create_task(supervisor.watch(), name="watch"),
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        done, pending = await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
        for task in pending:
            supervisor.on_event(
                f"the {task.get_name()} task did not stop within {CANCEL_WAIT_S:g}s; "
                "stopping the components anyway"
            )
        for task in done:
            if not task.cancelled() and isinstance(task.exception(), Exception):
                raise cast(Exception, task.exception())
