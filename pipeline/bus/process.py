"""The bus process of one twin (seed 002): three queue loops, a scrubber, HTTP in and out.

Theory of operation
-------------------
* **local loop** (``msgbus.system.local``): validates a client's request and,
  per destination, draws a uid ``dst.counter``, rewrites ``src``/``dst``/``uid``
  and stores the copy in ``msgbus.system.backlog`` (plus its deadline in the
  expiry set). A request for this same twin goes straight to
  ``msgbus.system.remote``; one for another twin is POSTed to its
  ``/zbus-remote``, several per POST when the peer takes batches (see
  :mod:`pipeline.bus.forward`; the backlog entry is what a restart resends). Any failure (invalid envelope, destination
  not found, expired) is answered at once on ``ret`` with ``err``.
* **remote loop** (``msgbus.system.remote``): forwards each request as it is
  to ``msgbus.$cmd``, where an application handles it and pushes its reply to
  ``msgbus.system.reply``. A request arriving on ``/zbus-remote`` skips this
  queue: the endpoint, having validated it, pushes it to ``msgbus.$cmd`` in
  the Lua step that records its uid (one Redis hop and one loop wake-up less
  per request; the handler sees the same envelope).
* **reply loop** (``msgbus.system.reply``): a reply for another twin goes to
  the outbox and is POSTed to its ``/zbus-reply``; a reply for this twin is
  matched with its backlog entry and pushed to the original ``ret``. A reply
  arriving on ``/zbus-reply`` skips this queue: the endpoint, having validated
  it, does the same match-and-answer in one Lua step before saying 200.
* **scrubber**: answers every backlog entry past its deadline with
  ``err = "request expired"`` and forgets old replay-protection entries.

Every loop claims atomically (queue -> inflight list) and releases in the
transaction that records the outcome, and pending requests (backlog) and
replies (outbox) are resent after a restart, so neither a crash nor a graceful stop loses a
request. The backlog + scrubber guarantee that each accepted request gets
exactly one answer on ``ret``: the reply, or an ``err``.

Poison messages: whatever a message makes a handler raise, the loop goes on.
A batch that fails stays in flight and is taken again one message at a
time; each of those attempts is counted in Redis *before* it starts (so a
message that kills the whole process counts too), and a message that reaches
``max_attempts`` moves to the dead-letter list (``msgbus.system.dead``, see
:mod:`pipeline.bus.dead`) with its last failure, instead of failing forever.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from aiohttp import web
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pipeline import keys
from pipeline.bus import answers, backlog, envelope
from pipeline.bus import tasks as bustasks
from pipeline.bus.config import REDIS_ERRORS, BusConfig, bus_redis_url, reraise_if_cancelling
from pipeline.bus.directory import Directory
from pipeline.bus.forward import Forwarder
from pipeline.bus.http import build_server
from pipeline.bus.ingress import Ingress
from pipeline.bus.lease import Lease, owner_id
from pipeline.bus.outbound import Final, Kind, Outbound, Outcome
from pipeline.bus.queues import QueueHandlers
from pipeline.bus.seat import Role, Seat
from pipeline.bus.signing import Signer
from pipeline.bus.store import BusStore
from pipeline.errors import EnvelopeError, Fenced
from pipeline.loggate import EVERY_S, LogGate
from pipeline.redisio import conn as redisconn
from pipeline.redisio.durability import Durability

log = logging.getLogger(__name__)

#: Longest blocking wait (BLMOVE) of a queue loop, in seconds.
_WAIT_S = 1
#: A queue's handler: (batch, how many to claim next) -> the next batch, claimed in the
#: transaction that records this batch's outcome.
Handle = Callable[[list[bytes], int], Awaitable[list[bytes]]]


class BusProcess:
    """One twin's bus. ``await start()``, then ``await stop()`` (idempotent, bounded)."""

    def __init__(
        self,
        config: BusConfig,
        *,
        redis_url: str,
        directory: Directory,
        signer: Signer | None,
        durability: Durability | None = None,
    ) -> None:
        self.config = config
        self.twin = config.twin
        #: Redis steps of the bus's loops that failed (Redis away or refusing writes) and
        #: were retried: ``sluice_bus_redis_errors_total``.
        self.redis_errors = 0
        #: Requests the scrubber answered "request expired" (``sluice_bus_answers_total``).
        self.expired = 0
        self._expired_at = 0.0  # when the scrubber last answered one
        self.redis = _connect(redis_url, config)
        self.store = BusStore(self.redis, max_seen=config.max_seen, max_item=config.max_size)
        self.directory = directory
        self._signer = signer
        self.forwarder = self._new_forwarder()
        # a reply matched: that request's pending retry is never sent (see Forwarder.answered)
        self.ingress = Ingress.from_config(config, directory, self.store, self._answered)
        #: Redis errors of the loops: one line per loop and interval, one when it recovers.
        self._gate = LogGate(log)
        self.queues = QueueHandlers(
            config=config,
            client=self.redis,
            store=self.store,
            directory=directory,
            forwarder=self.forwarder,
            durability=durability,
        )
        self._runner: web.ServerRunner | None = None
        #: The twin's lease (made at start, once the port is known) and this bus's seat.
        self.seat: Seat | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port = config.port
        self._stopped = False
        #: Digests of messages whose last attempt ended in a Redis error (see _recover_one).
        self._blips: set[str] = set()

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Serve HTTP, then become the twin's active bus or its standby (see :mod:`.seat`).

        Returns once this bus is active, or once it knows it stands by. HTTP is
        served in either role: what a peer POSTs is judged and written in one
        atomic step whichever bus of the twin takes it.
        """
        await self.redis.ping()
        await self.store.start_epoch()
        self._tasks.append(asyncio.create_task(self.store.coalescer.run(), name="bus-coalescer"))
        self._runner = web.ServerRunner(
            build_server(self.ingress), access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        # reuse_port: a standby may listen on the active bus's own host:port
        site = web.TCPSite(
            self._runner, self.config.host, self.config.port, reuse_address=True, reuse_port=True
        )
        await site.start()
        if self.config.port == 0:
            self.port = int(self._runner.addresses[0][1])
        lease = Lease(
            self.redis, ttl_s=self.config.twin_lease_s, owner=owner_id(self.config.host, self.port)
        )
        self.seat = Seat(twin=self.twin, lease=lease, store=self.store, activate=self._activate)
        self._tasks.append(asyncio.create_task(self.seat.run(), name="bus-seat"))
        seated = asyncio.create_task(self.seat.seated.wait())
        await asyncio.wait([seated, self._tasks[-1]], return_when=asyncio.FIRST_COMPLETED)
        seated.cancel()
        if self._tasks[-1].done():
            self._tasks[-1].result()  # it failed (Redis away): surfaces the failure
        log.info("bus: twin %s listening on %s:%s", self.twin, self.config.host, self.port)

    @property
    def role(self) -> str:
        """``active``, ``standby`` or ``starting``."""
        return self.seat.role.value if self.seat is not None else Role.STARTING.value

    async def _activate(self) -> list[asyncio.Task[None]]:
        """The active part: resend what is pending, then the loops and the scrubber."""
        previous = self.forwarder
        self.forwarder = self._new_forwarder()
        self.forwarder.outcomes, self.forwarder.retried = previous.outcomes, previous.retried
        self.queues.forwarder = self.forwarder
        tasks = [asyncio.create_task(self.forwarder.run(), name="bus-forwarder")]
        try:
            await backlog.resend_pending(
                self.store, self.forwarder, self.twin, self.config.max_pending
            )
        except BaseException:
            tasks[0].cancel()
            raise
        for name, queue, handle in (
            ("local", keys.BUS_LOCAL, self.queues.local),
            ("remote", keys.BUS_REMOTE, self.queues.remote),
            ("reply", keys.BUS_REPLY, self.queues.reply),
        ):
            tasks.append(asyncio.create_task(self._loop(queue, handle), name=f"bus-{name}-loop"))
        tasks.append(asyncio.create_task(self._scrubber(), name="bus-scrubber"))
        return tasks

    def _answered(self, uids: list[str]) -> None:
        self.forwarder.answered(uids)

    def _new_forwarder(self) -> Forwarder:
        """The sender of POSTs to peers, with the config's limits and retry pace."""
        config = self.config
        return Forwarder(
            twin=config.twin,
            directory=self.directory,
            signer=self._signer,
            done=self._forwarded,
            workers=config.http_workers,
            max_pending=config.max_pending,
            max_batch_bytes=config.max_size,
            retry_base_s=config.retry_base_s,
            retry_max_s=config.retry_max_s,
            pending=self.store.pending,
        )

    def _fenced(self, exc: Fenced) -> None:
        if self.seat is not None:
            self.seat.lost(str(exc))

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting HTTP, end every task, give the lease up; queued and pending work
        stays in Redis (the standby, or this bus started again, takes it up at once)."""
        if self._stopped:
            return
        self._stopped = True
        if self.seat is not None:
            self.seat.close()  # no takeover, no renewal from now on
        if self._runner is not None:
            try:
                await asyncio.wait_for(self._runner.cleanup(), grace_s)
            except TimeoutError:
                log.error("bus: HTTP requests still running after %.1fs; stopping anyway", grace_s)
        # the active part's tasks with the seat's: the seat's own wait for them may be cut short
        tasks = [*self._tasks, *(self.seat.tasks if self.seat is not None else [])]
        pending = await bustasks.end(tasks, grace_s)
        for task in tasks:
            if task in pending:
                log.error("bus: task %s did not stop in %.1fs", task.get_name(), grace_s)
            elif not task.cancelled() and task.exception() is not None:
                log.error("bus: task %s failed: %r", task.get_name(), task.exception())
        if self.seat is not None:
            await self.seat.release(ended=not pending)
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()

    async def wait(self) -> None:
        """Until a task fails (it should not): surfaces the failure."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()

    # --- queue loops ---------------------------------------------------------

    async def _loop(self, queue: str, handle: Handle) -> None:
        pause = 0.1
        batch_size = self.config.batch
        recover = True  # inflight items left by a crash or a failed batch go first, one by one
        batch: list[bytes] = []  # claimed by the previous batch's transaction
        # The flag also ends the loop within one BLMOVE wait should a cancellation be lost
        # inside the Redis client.
        while not self._stopped:
            redisconn.checkpoint()  # a cancellation that a Redis call dropped (see .tasks)
            try:
                if recover:
                    batch = []  # (a failed transaction's claims are in the inflight list)
                    recover = await self._recover_one(queue, handle)
                    continue
                if not batch:
                    # One round trip: a BLMOVE that returns at once when the queue holds
                    # something, and what queued with the first item joins it (no claim
                    # of its own first: after a batch whose transaction found the queue
                    # empty, that claim was a wasted trip per batch, and per idle wait).
                    batch = await self.store.wait_claim(queue, _WAIT_S, batch_size)
                    # (a claim of an empty queue can pass while writes are refused)
                    self._gate.ended(queue, "bus: %s loop: redis works again", queue)
                    if not batch:
                        continue
                batch = await handle(batch, batch_size)
                pause = 0.1
                self._gate.ended(queue, "bus: %s loop: redis works again", queue)
            except Fenced as exc:
                self._fenced(exc)
                return
            except REDIS_ERRORS as exc:
                reraise_if_cancelling(exc)
                recover = True
                self.redis_errors += 1
                self._gate.failed(queue, "bus: %s loop: redis error %r; retrying", queue, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
            except Exception:  # the boundary: a message broke its handler; isolate it
                log.exception(
                    "bus: %s loop: a batch failed; retrying its messages one by one", queue
                )
                recover = True

    async def _recover_one(self, queue: str, handle: Handle) -> bool:
        """Handle the first inflight item alone; False once the inflight list is empty.

        The attempt is counted before handling starts; past ``max_attempts`` the
        item goes to the dead-letter list instead.
        """
        items = await self.store.inflight(queue, 1)
        if not items:
            return False
        item = items[0]
        digest = hashlib.blake2b(item, digest_size=12).hexdigest()
        # An attempt that ended in a Redis error was not the message's fault: not counted.
        blip = digest in self._blips
        self._blips.discard(digest)
        attempts, why = await self.store.attempt(queue, digest, count=not blip)
        if attempts > self.config.max_attempts:
            reason = (
                f"handling failed {attempts - 1} times: "
                f"{why or 'the bus stopped while handling it'}"
            )
            log.error("bus: %s: message set aside in %s: %s", queue, keys.bus_dead(), reason)
            await self.store.bury_head(queue, digest, item, reason, attempts - 1)
            return True
        try:
            await handle([item], 0)
        except Fenced:
            raise
        except REDIS_ERRORS:
            if len(self._blips) < 64:
                self._blips.add(digest)
            raise
        except Exception as exc:  # the boundary: remember why, try again up to the limit
            log.exception("bus: %s: handling one message failed (attempt %d)", queue, attempts)
            await self.store.failed(queue, digest, f"{type(exc).__name__}: {exc}")
            return True
        await self.store.handled(queue, digest)
        return True

    # --- outbound outcomes, recovery, expiry --------------------------------

    async def _forwarded(self, finals: list[Final]) -> None:
        """Final outcomes of one POST: answer ``ret`` of failed requests; forget sent replies."""
        replies = [item.id for item, _, _ in finals if item.kind is Kind.REPLY]
        for item, outcome, text in finals:
            if item.kind is Kind.REPLY and outcome is not Outcome.DELIVERED:
                log.error("bus: reply %s to twin %s lost: %s", item.uid, item.to, text)
        failed = [
            self._answer_failed(item, text)
            for item, outcome, text in finals
            if item.kind is Kind.REQUEST and outcome is not Outcome.DELIVERED
        ]
        try:
            if replies:
                await self.store.drop_outbox(*replies)
        except REDIS_ERRORS:
            # Still in the outbox: resent on restart (the peer answers 409 or takes it again).
            log.exception("bus: could not forget %d sent replies", len(replies))
        await asyncio.gather(*failed)

    async def _answer_failed(self, item: Outbound, text: str) -> None:
        """Answer the caller of a request that could not be delivered."""
        try:
            request = envelope.load_trusted(item.body)
            fail = answers.error_reply(request, text, about=item.to, me=self.twin)
            await self.store.finish(item.uid, request.ret, fail.encode())
        except Fenced as exc:
            self._fenced(exc)
        except EnvelopeError:
            log.error("bus: corrupt pending request %s; the scrubber sets it aside", item.id)
        except REDIS_ERRORS:
            # Still in the backlog: resent on restart, or expired by the scrubber.
            log.exception("bus: could not record outcome of %s", item.id)

    async def _scrubber(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.config.scrub_interval_s)
            redisconn.checkpoint()
            try:
                await self.scrub(time.time())
                self._gate.ended("scrubber", "bus: scrubber: redis works again")
            except Fenced as exc:
                self._fenced(exc)
                return
            except REDIS_ERRORS as exc:
                reraise_if_cancelling(exc)
                self.redis_errors += 1
                self._gate.failed("scrubber", "bus: scrubber: redis error %r", exc)
            except Exception:  # the boundary: the scrubber must outlive any one entry
                log.exception("bus: scrubber failed; trying again")

    async def scrub(self, now: float) -> int:
        """Answer expired backlog entries with ``err`` (counted, logged through the gate);
        returns how many were answered."""
        answered = await backlog.scrub(self.store, self.queues, self.twin, now)
        self.expired += answered
        # one line per EVERY_S while requests keep expiring, one once none did for as long
        if answered:
            self._expired_at = now
            self._gate.failed("expired", "bus: %d request(s) answered 'request expired' (no "
                              "reply before exp; all counted in /metrics)", answered)  # fmt: skip
        elif now - self._expired_at > EVERY_S:
            self._gate.ended("expired", "bus: requests no longer expire unanswered")
        return answered


def _connect(redis_url: str, config: BusConfig) -> aioredis.Redis:
    """The bus's Redis client: its own pool, blocking reads up to :data:`_WAIT_S`."""
    client = redisconn.connect(
        bus_redis_url(redis_url),
        redisconn.Role.BUS,
        block_s=_WAIT_S,
        max_connections=config.redis_connections,
    )
    # No silent resend of a command whose connection dropped: claims and batch
    # transactions are not idempotent (a claim run twice would strand a batch in
    # flight); the loops recover from the inflight list instead.
    client.set_retry(Retry(NoBackoff(), 0))
    return client
