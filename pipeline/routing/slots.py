"""A worker's slot on a node: its bounded mailbox and the two loops that run the worker.

A :class:`Slot` holds a worker, its mailbox (bounded in messages and in
payload bytes) and its two tasks: the mailbox loop (:func:`run_mailbox`, which
hands queued messages to the worker's handler and settles each message's
completion future) and the run loop (:func:`run_worker`, the worker's own
long-running ``run``). The node creates both tasks when it adds the worker and
ends them when it stops it (:mod:`pipeline.routing.shutdown`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pipeline.errors import SluiceError
from pipeline.routing.message import Address, TransportMessage
from pipeline.routing.workerbase import Context, Worker, WorkerContext

if TYPE_CHECKING:
    from pipeline.routing.node import Node

__all__ = ["Done", "Item", "Slot", "put_when_room", "run_mailbox", "run_worker"]

log = logging.getLogger(__name__)

#: A message's completion future (None: nobody waits for it).
Done = asyncio.Future[None] | None
Item = tuple[TransportMessage, Done]


class Slot:
    """One worker at its main address: its mailbox, its queued bytes, its two tasks."""

    __slots__ = ("address", "bytes", "name", "queue", "room", "tasks", "worker")

    def __init__(self, name: str, worker: Worker) -> None:
        self.name = name
        self.address = Address.local(name)
        self.worker = worker
        self.queue: asyncio.Queue[Item] = asyncio.Queue(maxsize=max(1, worker.mailbox_size))
        #: Payload bytes queued, and an event set whenever some were taken out.
        self.bytes = 0
        self.room = asyncio.Event()
        #: The mailbox loop, then the run loop (see :meth:`run_task`).
        self.tasks: list[asyncio.Task[None]] = []

    def run_task(self) -> asyncio.Task[None] | None:
        """The task running the worker's ``run`` loop, once it was started."""
        return self.tasks[1] if len(self.tasks) > 1 else None

    def is_full_for(self, size: int) -> bool:
        """True when a message of ``size`` payload bytes must wait for room.

        One message bigger than the byte bound still gets into an empty mailbox.
        """
        return self.queue.full() or (
            self.bytes + size > self.worker.mailbox_bytes and not self.queue.empty()
        )

    def put_nowait(self, message: TransportMessage, done: Done) -> None:
        """Queue ``message``; the caller checked :meth:`is_full_for` first."""
        self.bytes += len(message.payload)
        self.queue.put_nowait((message, done))


async def put_when_room(slot: Slot, message: TransportMessage, done: Done) -> None:
    """Queue ``message`` once the mailbox has room for it (the sender's back-pressure)."""
    size = len(message.payload)
    while slot.bytes + size > slot.worker.mailbox_bytes and not slot.queue.empty():
        slot.room.clear()
        await slot.room.wait()
    slot.bytes += size
    await slot.queue.put((message, done))


async def run_worker(node: Node, slot: Slot, wctx: WorkerContext) -> None:
    """Run the worker's ``run`` loop; a failure is logged and counted now, and raised."""
    try:
        await slot.worker.run(wctx)
    except Exception:  # surfaced now (logged, counted) and again when the node stops
        node.counters["worker_run_failures"] += 1
        log.exception("node %s: worker %s stopped running", node.name, slot.name)
        raise


async def run_mailbox(node: Node, slot: Slot) -> None:
    """Hand queued messages to the worker, one or a batch at a time, until cancelled.

    A handler's failure is logged, counted and set on the messages' completion
    futures; it never ends the loop. A cancel cancels the futures of the batch
    in hand.
    """
    queue = slot.queue
    limit = max(1, slot.worker.batch_size)
    while True:
        items = await _take_batch(slot, limit)
        try:
            await _handle(node, slot, items, limit)
        finally:
            for _ in items:
                queue.task_done()


async def _take_batch(slot: Slot, limit: int) -> list[Item]:
    """Wait for one message, take up to ``limit`` queued ones, and make room for senders."""
    queue = slot.queue
    items = [await queue.get()]
    while len(items) < limit and not queue.empty():
        items.append(queue.get_nowait())
    slot.bytes -= sum(len(message.payload) for message, _ in items)
    slot.room.set()
    return items


async def _handle(node: Node, slot: Slot, items: list[Item], limit: int) -> None:
    """Call the worker's handler on ``items`` and settle their futures with the outcome."""
    worker = slot.worker
    contexts = [Context(node, message.onward_route[0], message) for message, _ in items]
    try:
        if limit == 1:
            await worker.handle(contexts[0])
        else:
            await worker.handle_batch(contexts)
    except asyncio.CancelledError:
        for _, done in items:
            if done is not None and not done.done():
                done.cancel()
        raise
    except SluiceError as exc:  # e.g. its reply could not be sent: no traceback
        node.counters["handler_errors"] += 1
        log.error("node %s: worker %s failed on a message: %s", node.name, slot.name, exc)
        _settle(items, exc)
    except Exception as exc:  # a handler bug must not stop the node: log, count, report
        node.counters["handler_errors"] += 1
        log.exception("node %s: worker %s failed on a message", node.name, slot.name)
        _settle(items, exc)
    else:
        node.counters["handled"] += len(items)
        _settle(items, None)


def _settle(items: list[Item], exc: Exception | None) -> None:
    """Complete every waiting future of ``items``: with ``exc``, or with success."""
    for _, done in items:
        if done is None or done.done():
            continue
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)
