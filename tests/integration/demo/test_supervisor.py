"""The supervisor with plain processes: group stop, the marker sweep, bounded restarts."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest

from pipeline.demo.procs import marked_pids
from pipeline.demo.supervisor import Component, State, Supervisor
from tests.support.poll import until

#: A process that ignores SIGTERM and starts a grandchild in its own session (like a JVM
#: that moved out of its parent's group): only the marker sweep can find that one.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print("ready", flush=True)
time.sleep(600)
"""


def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


async def test_stop_all_takes_down_groups_and_escaped_grandchildren(tmp_path: Path) -> None:
    demo_id = f"t-{uuid.uuid4().hex[:8]}"
    events: list[str] = []
    sup = Supervisor(demo_id, tmp_path, on_event=events.append)
    log = tmp_path / "stubborn.log"

    async def printed_ready() -> bool:
        return log.exists() and b"ready" in log.read_bytes()

    sup.add(Component(name="stubborn", argv=_py(STUBBORN), ready=printed_ready, stop_grace_s=1))
    sup.add(Component(name="sleeper", argv=_py("import time; time.sleep(600)")))
    try:
        await sup.start("stubborn")
        await sup.start("sleeper")
        # both, and the grandchild
        await until(lambda: len(marked_pids(demo_id)) >= 3, within_s=20, every_s=0.05)
        assert sup.rss_bytes() > 0
        # the grandchild left the group but is still counted for the component that started it
        by = sup.rss_by_component()
        assert set(by) == {"stubborn", "sleeper"} and all(v > 0 for v in by.values()), by
    finally:
        left = await sup.stop_all()
    assert any("time.sleep(600)" in line for line in left), left  # the escaped grandchild
    await until(lambda: marked_pids(demo_id) == [], every_s=0.05)
    assert all(c.state is State.STOPPED for c in sup.children.values())
    await sup.stop_all()  # twice is fine


async def test_a_dead_component_is_restarted_then_given_up(tmp_path: Path) -> None:
    demo_id = f"t-{uuid.uuid4().hex[:8]}"
    events: list[str] = []
    sup = Supervisor(demo_id, tmp_path, on_event=events.append, max_restarts=2)
    # lives half a second each time
    sup.add(Component(name="short", argv=_py("import time; time.sleep(0.5)")))
    await sup.start("short")
    watch = asyncio.create_task(sup.watch())
    try:
        await until(lambda: sup.children["short"].state is State.FAILED, within_s=20)
    finally:
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        await sup.stop_all()
    assert sup.children["short"].restarts == 2
    assert sum("restarting" in e for e in events) == 2, events
    assert "gave up after 2 restarts" in events[-1], events
    assert marked_pids(demo_id) == []


async def test_a_component_that_never_gets_ready_fails_with_its_log(tmp_path: Path) -> None:
    from pipeline.errors import DemoError

    async def never() -> bool:
        return False

    sup = Supervisor(f"t-{uuid.uuid4().hex[:8]}", tmp_path, stall_s=1.0)
    sup.add(
        Component(
            name="mute",
            argv=_py("print('starting up', flush=True); import time; time.sleep(600)"),
            ready=never,
            ready_timeout_s=1.0,
            waits_for="its port 1 to open",
        )
    )
    try:
        with pytest.raises(DemoError, match="not ready within 1s, and no progress for") as info:
            await sup.start("mute")
        assert "starting up" in str(info.value)
        assert "it waited for its port 1 to open" in str(info.value)
    finally:
        await sup.stop_all()
    assert marked_pids(sup.demo_id) == []


#: Starts slowly but steadily: a line every 0.1 s for 3 s, then says it is ready.
SLOW = """
import time
for i in range(30):
    print("migrating", i, flush=True)
    time.sleep(0.1)
print("ready", flush=True)
time.sleep(600)
"""


async def test_a_slow_component_making_progress_is_waited_for_past_its_deadline(
    tmp_path: Path,
) -> None:
    """Airflow on a loaded machine was given up at its 300 s while still starting (issue 33, 8);
    past its own deadline the supervisor waits while the log grows, and says what for."""
    events: list[str] = []
    sup = Supervisor(f"t-{uuid.uuid4().hex[:8]}", tmp_path, on_event=events.append, stall_s=5.0)
    log = tmp_path / "slow.log"

    async def printed_ready() -> bool:
        return log.exists() and b"ready" in log.read_bytes()

    sup.add(
        Component(
            name="slow", argv=_py(SLOW), ready=printed_ready, ready_timeout_s=1.0,
            waits_for="it to print ready",
        )
    )  # fmt: skip
    try:
        child = await sup.start("slow")
    finally:
        await sup.stop_all()
    assert child.state is State.STOPPED and child.up_after_s is not None
    assert child.up_after_s > 1.0  # past its own deadline
    [note] = [e for e in events if "still starting" in e]
    assert note.startswith("slow still starting after 1s, making progress"), note
    assert note.endswith("it waits for it to print ready"), note


async def test_the_start_limit_ends_any_wait(tmp_path: Path) -> None:
    from pipeline.errors import DemoError

    async def never() -> bool:
        return False

    sup = Supervisor(f"t-{uuid.uuid4().hex[:8]}", tmp_path, start_limit_s=1.0)
    sup.add(
        Component(
            name="busy",
            argv=_py("import time\nwhile True: print('x', flush=True); time.sleep(0.01)"),
            ready=never,
        )
    )
    try:
        with pytest.raises(DemoError, match="busy not ready within the start limit of 1s"):
            await sup.start("busy")
    finally:
        await sup.stop_all()
