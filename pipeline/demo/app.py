"""``sluice demo``: the whole system on this machine, live until Ctrl-C; ``--check`` scripts it.

Start-up: the prerequisites (Java, redis-server, Airflow, free ports, disk,
var/ git-ignored) are checked first, each missing one said in one line (exit
2). Then, under ``<var>/demo``: a private Redis; then at once ``sluice
spark`` (Connect), ``sluice serve``, ``sluice produce`` with reorgs, two
nodes, two bus twins and ``airflow standalone``; a subscriber from block 0
joins once the archive has trimmed Redis below block 0.

Stop: Ctrl-C or SIGTERM stops every process group and sweeps any process
still carrying the demo's marker (see :mod:`pipeline.demo.supervisor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import Progress

from pipeline.demo import components as comp
from pipeline.demo import prereq
from pipeline.demo.activity import Activity
from pipeline.demo.options import Options, parse
from pipeline.demo.plan import Plan
from pipeline.demo.procs import MARKER
from pipeline.demo.startup import progress_bar, running, start_all, warmer
from pipeline.demo.supervisor import Component, Supervisor
from pipeline.demo.view import render
from pipeline.errors import ConfigError, DemoError

#: Events kept for the view.
EVENTS = 8
#: Seconds between two frames of the live view.
FRAME_S = 0.5


def repo_root() -> Path:
    """The checkout holding ``dags/`` and ``plugins/`` (an editable install)."""
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / "dags").is_dir():
        raise ConfigError(f"no dags/ next to the package at {root}: run the demo from a checkout")
    return root


def plan_for(opts: Options, root: Path, demo_id: str = "") -> Plan:
    timing: dict[str, float | int | str] = {
        "demo_id": demo_id,
        "lake": opts.lake,
        "redis": opts.redis,
        "spark": opts.spark,
    }
    if opts.check:  # faster blocks and a shorter hot window: the check waits for a trim
        timing |= {"rate": 4.0, "reorg_every": 8, "hot_retention_s": 15}
    return Plan.make(
        root,
        opts.var_dir / "demo",
        serve_port=opts.serve_port,
        airflow_port=opts.airflow_port,
        spark_port=opts.spark_port,
        **timing,
    )


def user_ports(opts: Options) -> list[tuple[int, str]]:
    wanted = [(opts.serve_port, "status page, --serve-port")]
    if "airflow" in opts.only:
        wanted.append((opts.airflow_port, "Airflow UI, --airflow-port"))
    if "spark" in opts.only:
        wanted.append((opts.spark_port, "Spark Connect, --spark-port"))
    return wanted


def prepare(plan: Plan) -> None:
    """A clean demo directory. Airflow's home survives (its PostgreSQL keeps the migrated
    template that saves a minute) but for its task logs: each demo's Airflow starts on a
    metadata database of its own (:mod:`pipeline.demo.metadb`), and so on no earlier log."""
    plan.dir.mkdir(parents=True, exist_ok=True)
    for entry in plan.dir.iterdir():
        if entry.name in ("airflow",):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    shutil.rmtree(plan.airflow_home / "logs", ignore_errors=True)


def components_for(plan: Plan, only: tuple[str, ...]) -> list[Component]:
    made: list[Component] = []
    if plan.lake == "s3":
        made.append(comp.store_component(plan))
    if "spark" in only:
        made.append(comp.spark_component(plan))
    if "serve" in only:
        made.append(comp.serve_component(plan))
    if "produce" in only:
        made.append(comp.produce_component(plan))
    if "nodes" in only:
        made += comp.node_components(plan)
    if "buses" in only:
        comp.write_bus_keys(plan)
        made += comp.bus_components(plan)
    if "airflow" in only:
        made.append(comp.postgres_component(plan))
        made.append(comp.airflow_component(plan))
    return made


def main(argv: list[str]) -> int:
    opts = parse(argv)
    root = repo_root()
    # a caller (a test) may name the marker to look for leftovers itself
    demo_id = os.environ.get(MARKER) or uuid.uuid4().hex[:12]
    plan = plan_for(opts, root, demo_id)
    problems = prereq.missing(root, plan.dir, user_ports(opts), lake=opts.lake)
    if "airflow" not in opts.only:
        problems = [p for p in problems if "airflow" not in p]
    if problems:
        for line in problems:
            sys.stderr.write(f"sluice demo: {line}\n")
        return 2
    prepare(plan)
    return asyncio.run(_main(opts, plan))


async def _main(opts: Options, plan: Plan) -> int:
    console = Console(stderr=False)
    events: deque[str] = deque(maxlen=EVENTS)
    demo_id = plan.demo_id

    def event(text: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} {text}"
        events.append(stamped)
        if opts.check or not console.is_terminal:
            console.print(stamped, highlight=False, markup=False)

    supervisor = Supervisor(demo_id, plan.dir, on_event=event, start_limit_s=opts.start_timeout_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    code = 1
    try:
        supervisor.add(comp.redis_component(plan))
        for component in components_for(plan, opts.only):
            supervisor.add(component)
        if opts.check:
            from pipeline.demo.check import run_check

            code = await run_check(
                plan, supervisor, console, stop, started, opts.deadline_s, event, opts.follow_s
            )
        else:
            code = await _live(opts, plan, supervisor, console, stop, started, events, event)
    except DemoError as exc:
        console.print(f"[bold red]sluice demo:[/] {exc}", highlight=False)
        code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        console.print("stopping every component...", highlight=False)
        t0 = time.monotonic()
        left = await supervisor.stop_all()
        console.print(f"stopped in {time.monotonic() - t0:.1f}s", highlight=False)
        for line in left:
            console.print(f"  the sweep had to stop: {line}", highlight=False, markup=False)
    return code


@dataclass(slots=True)
class _Screen:
    """What the live view paints: the components, the traffic, the events, the subscriber."""

    plan: Plan
    supervisor: Supervisor
    activity: Activity
    events: deque[str]
    progress: Progress
    subscriber: Component
    #: Updates the subscriber from block 0 has logged, and how far its log was read.
    sub_lines: int = 0
    sub_offset: int = 0

    def frame(self, footer: str, with_progress: bool) -> RenderableType:
        return render(
            self.plan,
            self.supervisor,
            self.activity.counts,
            self.events,
            progress=self.progress if with_progress else None,
            subscriber_lines=self.sub_lines,
            footer=footer,
        )

    def count_subscriber_lines(self) -> None:
        if self.subscriber.name in self.supervisor.children:
            path = self.supervisor.log_path("subscriber")
            self.sub_offset, more = _count_added(path, self.sub_offset)
            self.sub_lines += more


async def _live(
    opts: Options,
    plan: Plan,
    supervisor: Supervisor,
    console: Console,
    stop: asyncio.Event,
    started: float,
    events: deque[str],
    event: Callable[[str], None],
) -> int:
    screen = _Screen(
        plan=plan,
        supervisor=supervisor,
        activity=Activity(plan, supervisor.is_up),
        events=events,
        progress=progress_bar(),
        subscriber=comp.subscriber_component(plan),
    )
    with Live(
        screen.frame("starting...", True),
        console=console,
        refresh_per_second=4,
        transient=False,
        redirect_stdout=False,
    ) as live:
        # the traffic and the watch start with the components: the view fills in
        # as they come up, and one that dies while others start is restarted
        async with running(screen.activity, supervisor):
            up_s = await _start_painting(live, screen, stop, event)
            if stop.is_set():
                return 130
            rss = supervisor.rss_bytes()
            event(f"all up in {up_s:.1f}s; the demo's processes use {rss / 2**20:.0f} MiB RSS")
            if opts.up_then_stop:
                return 0
            await _watch(live, screen, opts, stop, started, event)
    return 0


async def _start_painting(
    live: Live, screen: _Screen, stop: asyncio.Event, event: Callable[[str], None]
) -> float:
    """Start every component while the view repaints its progress; seconds until all were up."""

    async def paint() -> None:
        while True:
            live.update(screen.frame("starting... (Ctrl-C stops everything)", True))
            await asyncio.sleep(FRAME_S)

    painter = asyncio.create_task(paint())
    try:
        return await start_all(
            screen.supervisor, screen.progress, stop, event, warmer(screen.plan, event)
        )
    finally:
        painter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await painter


async def _watch(
    live: Live,
    screen: _Screen,
    opts: Options,
    stop: asyncio.Event,
    started: float,
    event: Callable[[str], None],
) -> None:
    """Repaint until ``stop``; once Redis was trimmed below block 0, a subscriber from 0 joins."""
    supervisor, subscriber = screen.supervisor, screen.subscriber
    while not stop.is_set():
        if (
            screen.activity.counts.trimmed
            and subscriber.name not in supervisor.children
            and "serve" in opts.only
        ):
            supervisor.add(subscriber)
            await supervisor.start(subscriber.name)
            event("Redis was trimmed below block 0: a subscriber from block 0 joined")
        screen.count_subscriber_lines()
        footer = (
            f"up {time.monotonic() - started:.0f}s, "
            f"RSS {supervisor.rss_bytes() / 2**20:.0f} MiB - Ctrl-C stops every component"
        )
        live.update(screen.frame(footer, False))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FRAME_S * 2):
                await stop.wait()


def _count_added(path: Path, offset: int) -> tuple[int, int]:
    """Subscriber log lines with an update since ``offset``: (new offset, count)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(8 << 20)
    except OSError:
        return offset, 0
    end = data.rfind(b"\n") + 1
    return offset + end, data[:end].count(b'{"added"')
