"""The steps that stop a node's workers and transports, each run even when another failed.

A node's stop (and ``remove_worker``) hands these steps, in order, to
:func:`pipeline.lifecycle.run_every`: every worker is asked to stop, the run
loops are awaited and the mailboxes drain (both bounded by the deadline), the
slots' tasks end, then, worker by worker, the messages still queued fail and
the worker's teardown runs; last the transports stop. A step that fails is
logged here once, with its cause, and the next steps still run; the failures
are raised together by ``run_every`` at the end.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from pipeline.errors import UnroutableMessage
from pipeline.routing.slots import Slot

if TYPE_CHECKING:
    from pipeline.routing.node import Transport

__all__ = ["Step", "slot_steps", "transport_step"]

log = logging.getLogger(__name__)

#: One step of a cleanup, as :func:`pipeline.lifecycle.run_every` takes it.
Step = Callable[[], Awaitable[object]]


def _left(deadline: float) -> float:
    """Seconds left until ``deadline``; at least a tenth, so every wait gets a chance."""
    return max(0.1, deadline - time.monotonic())


def slot_steps(node_name: str, slots: Sequence[Slot], deadline: float) -> list[Step]:
    """The steps that stop ``slots``, in order: their workers drain, then each is torn down."""
    steps: list[Step] = [functools.partial(_ask_to_stop, node_name, slot) for slot in slots]
    steps.append(functools.partial(_await_run_loops, slots, deadline))
    steps.append(functools.partial(_await_drained, slots, deadline))
    steps.append(functools.partial(_end_tasks, node_name, slots))
    for slot in slots:
        steps.append(functools.partial(_fail_queued, slot))
        steps.append(functools.partial(_teardown, node_name, slot))
    return steps


def transport_step(node_name: str, transport: Transport, deadline: float) -> Step:
    """The step that stops ``transport``, bounded by ``deadline``."""
    return functools.partial(_stop_transport, node_name, transport, deadline)


async def _ask_to_stop(node_name: str, slot: Slot) -> None:
    """Tell the worker to start nothing new (consumers stop pulling)."""
    try:
        slot.worker.stopping()
    except Exception:
        log.exception("node %s: worker %s failed when asked to stop", node_name, slot.name)
        raise


async def _await_run_loops(slots: Sequence[Slot], deadline: float) -> None:
    """Give the workers' run loops until the deadline to end by themselves."""
    run_tasks = [task for task in (slot.run_task() for slot in slots) if task is not None]
    if run_tasks:
        await asyncio.wait(run_tasks, timeout=_left(deadline))


async def _await_drained(slots: Sequence[Slot], deadline: float) -> None:
    """Let the mailboxes drain until the deadline (all loops still run, so workers can still talk)."""
    joins = [asyncio.ensure_future(slot.queue.join()) for slot in slots]
    if not joins:
        return
    try:
        await asyncio.wait(joins, timeout=_left(deadline))
    finally:  # a join left waiting would outlive the node
        for join in joins:
            join.cancel()
        await asyncio.gather(*joins, return_exceptions=True)


async def _end_tasks(node_name: str, slots: Sequence[Slot]) -> None:
    """Cancel every slot's tasks and await them; a task that had failed is logged.

    A run loop's failure was raised to nobody: it was logged and counted when
    it happened, and is logged again here, not raised.
    """
    owners = [slot for slot in slots for _ in slot.tasks]
    tasks = [task for slot in slots for task in slot.tasks]
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for slot, result in zip(owners, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            log.error("node %s: worker %s failed: %r", node_name, slot.name, result)


async def _fail_queued(slot: Slot) -> None:
    """Fail the completion future of every message still queued: it will not be handled."""
    while not slot.queue.empty():
        _, done = slot.queue.get_nowait()
        if done is not None and not done.done():
            done.set_exception(UnroutableMessage(f"worker {slot.name} stopped"))


async def _teardown(node_name: str, slot: Slot) -> None:
    """Run the worker's teardown; its failure is logged here and raised to the step runner."""
    try:
        await slot.worker.teardown()
    except Exception:
        log.exception("node %s: worker %s failed its teardown", node_name, slot.name)
        raise


async def _stop_transport(node_name: str, transport: Transport, deadline: float) -> None:
    """Stop ``transport`` by the deadline: late is logged, a failure logged and raised."""
    try:
        await asyncio.wait_for(transport.stop(), _left(deadline))
    except TimeoutError:
        log.error("node %s: transport %s did not stop in time", node_name, transport)
    except Exception:
        log.exception("node %s: transport %d failed to stop", node_name, transport.address_type)
        raise
