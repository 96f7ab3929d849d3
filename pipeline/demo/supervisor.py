"""Start, watch, restart and stop the demo's child processes.

Theory of operation: a :class:`Component` says how to run one process (its
argv and environment) and how to tell it is ready (an async probe). The
:class:`Supervisor` starts each one in its own session and process group
(``start_new_session``), with its output appended to ``<log_dir>/<name>.log``
and ``SLUICE_DEMO_ID`` in its environment, then polls the probe until it
answers or the process exits. The component's own start deadline is what it
takes on a quiet machine: past it the supervisor keeps waiting while the
component makes progress (its log grows, its processes use CPU), says every
minute what it waits for, and gives up after ``stall_s`` without progress or
at ``start_limit_s`` (:mod:`pipeline.demo.patience`).

While the demo runs, :meth:`Supervisor.watch` notices a child that exited,
reports it through ``on_event`` and starts it again, at most
``max_restarts`` times per component; past that the component is marked
failed (the demo keeps running the others and shows it).

:meth:`Supervisor.stop_all` stops the components in reverse start order:
SIGTERM to the whole process group (``airflow standalone`` leaves its
scheduler and API server running on a SIGTERM to itself alone), SIGKILL to
the group after the component's grace period, then a sweep of every process
still carrying the demo's marker, wherever it moved (a JVM in its own group,
a task runner in its own session). It is safe to call twice. Each child also
gets SIGTERM from the kernel if the supervisor dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import enum
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pipeline.demo import procs
from pipeline.demo.patience import STALL_S, Patience
from pipeline.errors import DemoError
from pipeline.runtime.parentdeath import bound_to_parent

Probe = Callable[[], Awaitable[bool]]

#: Restarts of one component before it is left failed.
MAX_RESTARTS = 3
#: Seconds between two looks at the children.
WATCH_EVERY_S = 0.5
#: Lines of a child's log quoted when it fails to start.
LOG_TAIL = 12
#: Seconds the final sweep waits between SIGTERM and SIGKILL.
SWEEP_GRACE_S = 3.0
#: The longest one component may take to start while it makes progress (``--start-timeout``).
START_LIMIT_S = 1800.0
#: Seconds between two measures of a starting component's progress (a walk of ``/proc``).
SAMPLE_EVERY_S = 2.0


class State(enum.Enum):
    WAITING = "waiting"
    STARTING = "starting"
    UP = "up"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True, kw_only=True)
class Component:
    """How to run one demo process."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    #: Answers True once the process serves; None: up as soon as it runs.
    ready: Probe | None = None
    ready_timeout_s: float = 60.0
    #: SIGTERM to SIGKILL, in seconds.
    stop_grace_s: float = 10.0
    #: What the live view says this component is for.
    role: str = ""
    #: What ``ready`` waits for, said while the demo waits longer than ``ready_timeout_s``.
    #: A probe with a ``detail`` attribute adds its last answer to it.
    waits_for: str = ""


@dataclass(slots=True)
class Child:
    """One component's current process and its history (mutable, owned by the supervisor)."""

    component: Component
    state: State = State.WAITING
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float | None = None
    up_after_s: float | None = None
    last_exit: int | None = None
    error: str = ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class Supervisor:
    def __init__(
        self,
        demo_id: str,
        log_dir: Path,
        *,
        on_event: Callable[[str], None] = lambda text: None,
        max_restarts: int = MAX_RESTARTS,
        start_limit_s: float = START_LIMIT_S,
        stall_s: float = STALL_S,
    ) -> None:
        self.demo_id = demo_id
        self.log_dir = Path(log_dir)
        self.on_event = on_event
        self.max_restarts = max_restarts
        self.start_limit_s = start_limit_s
        self.stall_s = stall_s
        self.children: dict[str, Child] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._stopping = False
        self._restarting: set[str] = set()

    # --- start --------------------------------------------------------------

    def add(self, component: Component) -> Child:
        child = Child(component)
        self.children[component.name] = child
        return child

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _spawn(self, child: Child) -> None:
        comp = child.component
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = self._logs.get(comp.name)
        if out is None:
            out = self._logs[comp.name] = self.log_path(comp.name).open("ab")
        out.write(f"\n=== sluice demo: starting {comp.name} at {time.ctime()} ===\n".encode())
        out.flush()
        env = {**os.environ, **comp.env, procs.MARKER: self.demo_id}
        child.proc = subprocess.Popen(
            bound_to_parent(comp.argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        child.started_at = time.monotonic()
        child.state = State.STARTING

    async def start(self, name: str) -> Child:
        """Start one added component and wait until it is ready; :class:`DemoError` if not."""
        child = self.children[name]
        while True:
            self._spawn(child)
            try:
                await self._wait_ready(child)
                return child
            except DemoError:
                # an exit while starting is restarted like any other (bounded); a
                # component that never answers its probe is not
                if child.last_exit is None or child.restarts >= self.max_restarts:
                    raise
                child.restarts += 1
                self.on_event(
                    f"{name} {child.error}; restarting ({child.restarts}/{self.max_restarts}, "
                    f"log {self.log_path(name)})"
                )
                self._kill_group(child, signal.SIGKILL)

    async def _wait_ready(self, child: Child) -> None:
        comp = child.component
        assert child.proc is not None and child.started_at is not None
        patience = Patience(
            started=child.started_at, base_s=comp.ready_timeout_s,
            limit_s=self.start_limit_s, stall_s=self.stall_s,
        )  # fmt: skip
        child.last_exit = None
        sampled, shown = float("-inf"), (0, 0.0)
        while True:
            code = child.proc.poll()
            if code is not None:
                child.state, child.last_exit = State.FAILED, code
                child.error = f"exited with code {code} while starting"
                raise DemoError(
                    f"{comp.name} {child.error}; {self.log_path(comp.name)}:\n"
                    f"{self.log_tail(comp.name)}"
                )
            if comp.ready is None or await _probe(comp.ready):
                child.state = State.UP
                child.up_after_s = time.monotonic() - child.started_at
                return
            now = time.monotonic()
            if now - sampled >= SAMPLE_EVERY_S:
                sampled, shown = now, self._progress(child)
                patience.sample(now, *shown)
            why = patience.give_up(now)
            if why is not None:
                child.state = State.FAILED
                child.error = f"not ready {why}"
                raise DemoError(
                    f"{comp.name} {child.error}; it waited for {waiting_for(comp)}; "
                    f"{self.log_path(comp.name)}:\n{self.log_tail(comp.name)}"
                )
            note = patience.note(now, *shown)
            if note is not None:
                self.on_event(f"{comp.name} {note}; it waits for {waiting_for(comp)}")
            await asyncio.sleep(0.25)

    def _progress(self, child: Child) -> tuple[int, float]:
        """What a starting component shows: its log's size, and the CPU seconds of its tree."""
        try:
            logged = self.log_path(child.component.name).stat().st_size
        except OSError:
            logged = 0
        if child.pid is None:
            return logged, 0.0
        tree = procs.in_tree(child.pid, procs.marked_pids(self.demo_id))
        return logged, procs.cpu_seconds(tree)

    def log_tail(self, name: str, lines: int = LOG_TAIL) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # --- watch --------------------------------------------------------------

    async def watch(self) -> None:
        """Until cancelled: report and restart (bounded) every component that exits."""
        restarts: set[asyncio.Task[None]] = set()
        try:
            while True:
                for child in list(self.children.values()):
                    if self._stopping or child.proc is None or child.state is not State.UP:
                        continue
                    code = child.proc.poll()
                    if code is None:
                        continue
                    child.last_exit = code
                    name = child.component.name
                    if child.restarts >= self.max_restarts:
                        child.state = State.FAILED
                        child.error = (
                            f"exited with code {code}; gave up after {child.restarts} restarts"
                        )
                        self.on_event(f"{name} {child.error} (log {self.log_path(name)})")
                        continue
                    child.restarts += 1
                    child.state = State.RESTARTING
                    self.on_event(
                        f"{name} exited with code {code}; restarting "
                        f"({child.restarts}/{self.max_restarts}, log {self.log_path(name)})"
                    )
                    task = asyncio.create_task(self._restart(child))
                    restarts.add(task)
                    task.add_done_callback(restarts.discard)
                await asyncio.sleep(WATCH_EVERY_S)
        finally:
            for task in restarts:
                task.cancel()
            await asyncio.gather(*restarts, return_exceptions=True)

    async def _restart(self, child: Child) -> None:
        self._kill_group(child, signal.SIGKILL)  # whatever the dead leader left behind
        self._spawn(child)
        try:
            await self._wait_ready(child)
        except DemoError as exc:
            self.on_event(str(exc).splitlines()[0])
            # watch() sees an exit again and counts it against the budget
            child.state = State.UP
        else:
            self.on_event(f"{child.component.name} is up again")

    # --- stop ---------------------------------------------------------------

    def _kill_group(self, child: Child, sig: signal.Signals) -> None:
        if child.proc is not None:
            procs.signal_group(child.proc.pid, sig)

    async def stop(self, name: str) -> None:
        """Stop one component (its whole process group); it is not restarted."""
        child = self.children[name]
        await self._stop_child(child)

    async def _stop_child(self, child: Child) -> None:
        child.state = State.STOPPED
        proc = child.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._kill_group(child, signal.SIGTERM)
            deadline = time.monotonic() + child.component.stop_grace_s
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        # the leader may be gone while its group lives on (airflow standalone's children)
        self._kill_group(child, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(timeout=5)
        out = self._logs.pop(child.component.name, None)
        if out is not None:
            out.close()

    async def stop_all(self) -> list[str]:
        """Stop every component (reverse start order), then sweep the marker.

        Returns the command lines of processes the sweep had to kill (empty:
        every process group took its processes down by itself).
        """
        self._stopping = True
        started = [c for c in self.children.values() if c.proc is not None]
        started.sort(key=lambda c: c.started_at or 0.0, reverse=True)
        # groups stop in parallel: each may take its grace period
        await asyncio.gather(*(self._stop_child(c) for c in started))
        return await sweep(self.demo_id)

    # --- figures ------------------------------------------------------------

    def is_up(self, name: str) -> bool:
        child = self.children.get(name)
        return child is not None and child.state is State.UP

    def rss_by_component(self) -> dict[str, int]:
        """RSS per component: each process counts for the component that started it."""
        roots = {c.pid: name for name, c in self.children.items() if c.pid is not None}
        return procs.rss_by_root(procs.marked_pids(self.demo_id), roots)

    def rss_bytes(self) -> int:
        """Resident memory of every process of the demo (children and their children)."""
        return procs.rss_bytes(procs.marked_pids(self.demo_id))


async def sweep(demo_id: str, grace_s: float = SWEEP_GRACE_S) -> list[str]:
    """SIGTERM, then SIGKILL, every live process carrying the marker; their command lines."""
    pids = procs.marked_pids(demo_id)
    if not pids:
        return []
    left = [procs.command_line(pid) for pid in pids]
    procs.signal_pids(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids := procs.marked_pids(demo_id):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    procs.signal_pids(pids, signal.SIGKILL)
    return left


def waiting_for(comp: Component) -> str:
    """What ``comp``'s start waits for, with its probe's last answer when it keeps one."""
    what = comp.waits_for or "its readiness probe"
    detail = getattr(comp.ready, "detail", "")
    return f"{what} ({detail})" if detail else what


async def _probe(check: Probe) -> bool:
    try:
        async with asyncio.timeout(5.0):
            return await check()
    except (OSError, TimeoutError):
        return False
