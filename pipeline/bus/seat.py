"""Active or standby: the part of a bus process that holds (or waits for) its twin's lease.

A :class:`Seat` runs forever: as a standby it tries to take the lease every
quarter of its TTL (one log line while another bus holds it); once it holds
it, it starts the active part of the bus (the queue loops, the forwarder, the
scrubber, after resending what the previous owner left pending), renews the
lease at the same pace, and steps down (one log line, the active part
cancelled) when a renewal finds the lease taken or a fenced write was refused
(:class:`~pipeline.errors.Fenced`). See :mod:`pipeline.bus.lease`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable

from pipeline.bus import tasks as bustasks
from pipeline.bus.config import REDIS_ERRORS, reraise_if_cancelling
from pipeline.bus.lease import Lease, retire
from pipeline.bus.store import BusStore
from pipeline.loggate import LogGate
from pipeline.redisio.conn import checkpoint

log = logging.getLogger(__name__)

#: Starts the active part of the bus: its tasks (cancelled when the lease is lost).
Activate = Callable[[], Awaitable[list["asyncio.Task[None]"]]]
#: Seconds the active part gets to end when the lease is lost.
STEP_DOWN_S = 5.0
#: Longest wait for Redis to drop the lease at a stop, in seconds.
RELEASE_S = 2.0


class Role(enum.Enum):
    STARTING = "starting"
    STANDBY = "standby"
    ACTIVE = "active"


class Seat:
    def __init__(self, *, twin: int, lease: Lease, store: BusStore, activate: Activate) -> None:
        self.twin = twin
        self.lease = lease
        self.store = store
        self.role = Role.STARTING
        #: The owner id of the active bus as last seen (this one's own when active).
        self.active = ""
        #: Times this bus took the lease, and gave it up.
        self.takeovers = 0
        self.stepdowns = 0
        self._activate = activate
        self._lost = asyncio.Event()
        self._why = ""
        #: Set once this bus knows its role (active or standby).
        self.seated = asyncio.Event()
        #: The active part's tasks while this bus is active (a stop ends them with the seat).
        self.tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._gate = LogGate(log)

    def close(self) -> None:
        """The bus stops: from now on the seat takes no lease and renews none."""
        self._closed = True

    async def release(self, *, ended: bool) -> None:
        """After :meth:`close` and the seat's end: give the lease up (the standby takes
        over at once); a Redis away leaves it to lapse. ``ended``: every task of the
        bus ended, its owner id may serve a bus started again in this process."""
        try:
            async with asyncio.timeout(RELEASE_S):
                await self.lease.release()
        except (*REDIS_ERRORS, TimeoutError) as exc:
            ttl = self.lease.ttl_ms / 1000
            log.warning("bus: could not give the lease up (%r): it lapses in %.1fs", exc, ttl)
        if ended:
            retire(self.lease.owner)

    def lost(self, why: str) -> None:
        """A write of the active part was refused (fenced): step down."""
        if not self._why:
            self._why = why
        self._lost.set()

    async def run(self) -> None:
        """Stand by, serve while holding the lease, step down when it is lost; again."""
        announced = False
        while True:
            await self._stand_by(announced)
            announced = True
            try:
                self.tasks = await self._activate()
            except REDIS_ERRORS as exc:  # the lease is still this bus's: try again
                reraise_if_cancelling(exc)
                self._gate.failed("activate", "bus: taking over failed: %r; retrying", exc)
                await asyncio.sleep(self.lease.pace_s)
                continue
            try:
                why = await self._hold(self.tasks)
            finally:
                # (when the bus stops, its stop ends these tasks too: see BusProcess.stop)
                stuck = await bustasks.end(self.tasks, STEP_DOWN_S)
                for task in stuck:
                    log.error("bus: task %s did not stop in %.1fs", task.get_name(), STEP_DOWN_S)
            # The store keeps the lost token: a write of a straggler is still refused.
            self.tasks = []
            self.role = Role.STANDBY
            self.stepdowns += 1
            log.warning(
                "bus: twin %s: %s; standby now, taking over when its lease lapses",
                self.twin,
                why,
            )

    async def _stand_by(self, announced: bool) -> None:
        """Until this bus holds the lease (then its token fences the store's writes)."""
        while True:
            self._checkpoint()
            try:
                holder = await self.lease.acquire()
                if self.lease.token:
                    self.store.token = self.lease.token
                    break
            except REDIS_ERRORS as exc:
                reraise_if_cancelling(exc)
                self._gate.failed("lease", "bus: lease: redis error %r; retrying", exc)
                await asyncio.sleep(self.lease.pace_s)
                continue
            self._gate.ended("lease", "bus: lease: redis works again")
            self.active = holder
            if not announced:
                log.warning(
                    "bus: standby for twin %s: the active bus is %s, "
                    "taking over when its lease lapses",
                    self.twin,
                    holder,
                )
                announced = True
            self.role = Role.STANDBY
            self.seated.set()
            await asyncio.sleep(self.lease.pace_s)
        self._lost.clear()
        self._why = ""
        self.active = self.lease.owner
        self.takeovers += 1
        self.role = Role.ACTIVE
        self.seated.set()
        log.info("bus: twin %s: active, lease token %s", self.twin, self.lease.token)

    async def _hold(self, tasks: list[asyncio.Task[None]]) -> str:
        """Renew the lease while the active part runs; why it ended (lost lease)."""
        lost = asyncio.create_task(self._lost.wait())
        try:
            while True:
                self._checkpoint()
                # (a loop that ended, as they do while the bus stops, is not waited on again)
                running = [task for task in tasks if not task.done()]
                await asyncio.wait([*running, lost], timeout=self.lease.pace_s,
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                for task in tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if self._why:
                    return f"a write was refused ({self._why})"
                try:
                    if await self.lease.renew():
                        self._gate.ended("renew", "bus: lease: renewed again")
                        continue
                    holder = await self.lease.holder()
                    return f"lease lost to {holder or 'nobody (it lapsed)'}"
                except REDIS_ERRORS as exc:
                    # Writes are fenced meanwhile; a lease lost is found at the next renewal.
                    reraise_if_cancelling(exc)
                    self._gate.failed("renew", "bus: lease: renewal failed: %r", exc)
        finally:
            lost.cancel()

    def _checkpoint(self) -> None:
        """End the seat's task if it was cancelled (even if a Redis call dropped the
        cancellation: see :mod:`pipeline.bus.tasks`) or the bus stops."""
        checkpoint()
        if self._closed:
            raise asyncio.CancelledError("the bus stops")
