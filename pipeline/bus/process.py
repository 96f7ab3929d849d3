"""The bus process of one twin (seed 002): three queue loops, a scrubber, HTTP in and out.

Theory of operation
-------------------
* **local loop** (``msgbus.system.local``): validates a client's request and,
  per destination, draws a uid ``dst.counter``, rewrites ``src``/``dst``/``uid``
  and stores the copy in ``msgbus.system.backlog`` (plus its deadline in the
  expiry set). A request for this same twin goes straight to
  ``msgbus.system.remote``; one for another twin goes to the outbox and is
  POSTed to its ``/zbus-remote``. Any failure (invalid envelope, destination
  not found, expired) is answered at once on ``ret`` with ``err``.
* **remote loop** (``msgbus.system.remote``): forwards each request as it is
  to ``msgbus.$cmd``, where an application handles it and pushes its reply to
  ``msgbus.system.reply``.
* **reply loop** (``msgbus.system.reply``): a reply for another twin goes to
  the outbox and is POSTed to its ``/zbus-reply``; a reply for this twin is
  matched with its backlog entry and pushed to the original ``ret``.
* **scrubber**: answers every backlog entry past its deadline with
  ``err = "request expired"`` and forgets old replay-protection entries.

Every loop claims atomically (queue -> inflight list) and releases in the
transaction that records the outcome, and outbound HTTP is resent from the
outbox after a restart, so neither a crash nor a graceful stop loses a
request. The backlog + scrubber guarantee that each accepted request gets
exactly one answer on ``ret``: the reply, or an ``err``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions
from aiohttp import web

from pipeline import keys
from pipeline.bus import envelope
from pipeline.bus.directory import Directory
from pipeline.bus.envelope import Envelope
from pipeline.bus.forward import Forwarder, Kind, Outbound, Outcome
from pipeline.bus.http import Ingress, build_app
from pipeline.bus.signing import Signer
from pipeline.bus.store import BusStore
from pipeline.errors import EnvelopeError
from pipeline.settings import Settings

log = logging.getLogger(__name__)

_REDIS_ERRORS = (redis.exceptions.RedisError, OSError)


@dataclass(frozen=True, slots=True, kw_only=True)
class BusConfig:
    """Tunables of one bus process (the twin-facing ones come from :class:`Settings`)."""

    twin: int
    host: str = "127.0.0.1"
    port: int = 8051
    legacy_peers: bool = False
    default_exp: int = 300
    max_exp: int = 86400
    max_try: int = 16
    retry_base_s: float = 0.1
    retry_max_s: float = 2.0
    max_size: int = 1 << 20
    batch: int = 256
    scrub_interval_s: float = 0.25
    http_workers: int = 128
    max_pending: int = 10_000
    redis_connections: int = 32

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: object) -> BusConfig:
        host, _, port = settings.bus_listen.rpartition(":")
        values: dict[str, object] = {
            "twin": settings.bus_twin,
            "host": host or "127.0.0.1",
            "port": int(port),
            "legacy_peers": settings.bus_legacy_peers,
            "default_exp": settings.bus_default_exp_s,
            "max_exp": settings.bus_max_exp_s,
            "max_try": settings.bus_max_try,
            "retry_base_s": settings.bus_retry_base_s,
            "retry_max_s": settings.bus_retry_max_s,
            "max_size": settings.max_payload,
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


class BusProcess:
    """One twin's bus. ``await start()``, then ``await stop()`` (idempotent, bounded)."""

    def __init__(
        self,
        config: BusConfig,
        *,
        redis_url: str,
        directory: Directory,
        signer: Signer | None,
    ) -> None:
        self.config = config
        self.twin = config.twin
        pool = aioredis.BlockingConnectionPool.from_url(
            redis_url, max_connections=config.redis_connections, timeout=10
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        self.store = BusStore(self.redis)
        self.directory = directory
        self.forwarder = Forwarder(
            twin=config.twin,
            directory=directory,
            signer=signer,
            done=self._forwarded,
            workers=config.http_workers,
            max_pending=config.max_pending,
            retry_base_s=config.retry_base_s,
            retry_max_s=config.retry_max_s,
        )
        self._ingress = Ingress(
            twin=config.twin,
            directory=directory,
            store=self.store,
            legacy_peers=config.legacy_peers,
            default_exp=config.default_exp,
            max_exp=config.max_exp,
            max_size=config.max_size,
        )
        self._counters = UidCounters(self.redis)
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port = config.port
        self._stopped = False

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        await self.redis.ping()
        self._tasks.append(asyncio.create_task(self.store.coalescer.run(), name="bus-coalescer"))
        self._tasks.append(asyncio.create_task(self.forwarder.run(), name="bus-forwarder"))
        await self._resend_outbox()
        self._runner = web.AppRunner(build_app(self._ingress), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, reuse_address=True)
        await site.start()
        if self.config.port == 0:
            self.port = int(self._runner.addresses[0][1])
        for name, queue, handle in (
            ("local", keys.BUS_LOCAL, self._handle_local),
            ("remote", keys.BUS_REMOTE, self._handle_remote),
            ("reply", keys.BUS_REPLY, self._handle_reply),
        ):
            self._tasks.append(
                asyncio.create_task(self._loop(queue, handle), name=f"bus-{name}-loop")
            )
        self._tasks.append(asyncio.create_task(self._scrubber(), name="bus-scrubber"))
        log.info("bus: twin %s listening on %s:%s", self.twin, self.config.host, self.port)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting HTTP, cancel the loops; queued and pending work stays in Redis."""
        if self._stopped:
            return
        self._stopped = True
        if self._runner is not None:
            await asyncio.wait_for(self._runner.cleanup(), grace_s)
        for task in self._tasks:
            task.cancel()
        _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
        for task in self._tasks:
            if task in pending:
                log.error("bus: task %s did not stop in %.1fs", task.get_name(), grace_s)
            elif not task.cancelled() and task.exception() is not None:
                log.error("bus: task %s failed: %r", task.get_name(), task.exception())
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()

    async def wait(self) -> None:
        """Until a task fails (it should not): surfaces the failure."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()

    # --- queue loops ---------------------------------------------------------

    async def _loop(self, queue: str, handle: Callable[[list[bytes]], Awaitable[None]]) -> None:
        pause = 0.1
        batch_size = self.config.batch
        recover = True  # inflight items left by a crash or a failed transaction go first
        # The flag also ends the loop within one BLMOVE wait should a cancellation be lost
        # inside the Redis client.
        while not self._stopped:
            try:
                if recover:
                    batch = await self.store.inflight(queue, batch_size)
                    recover = bool(batch)
                else:
                    batch = await self.store.claim(queue, batch_size)
                if not batch:
                    first = await self.store.wait_one(queue, 1)
                    if first is None:
                        continue
                    batch = [first]
                await handle(batch)
                pause = 0.1
            except _REDIS_ERRORS as exc:
                reraise_if_cancelling(exc)
                recover = True
                log.warning("bus: %s loop: redis error %r, retrying in %.1fs", queue, exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _handle_local(self, batch: list[bytes]) -> None:
        now = time.time()
        answers: list[tuple[str, bytes]] = []  # (ret, answer) pushed right away
        routed: list[tuple[Envelope, float, int]] = []  # (request, deadline, destination)
        for raw in batch:
            try:
                env = envelope.decode(raw, max_size=self.config.max_size)
            except EnvelopeError as exc:
                ret, cmd = envelope.salvage(raw)
                if not ret:
                    log.warning("bus: dropped unreadable request (no ret): %s", exc)
                    continue
                log.info("bus: invalid request answered on %s: %s", ret, exc)
                bad = Envelope(cmd=cmd, ret=ret, dst=[self.twin], now=int(now))
                answers.append((ret, bad.copy(err=exc.public_message).encode()))
                continue
            expires = envelope.deadline(
                env, received=now, default_exp=self.config.default_exp, max_exp=self.config.max_exp
            )
            for dst in env.dst:
                about = env.copy(dst=[dst], src=self.twin)
                if expires <= now:
                    fail = envelope.error_reply(about, "request expired", about=dst, me=self.twin)
                    answers.append((env.ret, fail.encode()))
                elif dst != self.twin and await self.directory.lookup(dst) is None:
                    fail = envelope.error_reply(
                        about, "destination not found", about=dst, me=self.twin
                    )
                    answers.append((env.ret, fail.encode()))
                else:
                    routed.append((env, expires, dst))
        outbound: list[Outbound] = []
        async with self.redis.pipeline(transaction=True) as pipe:
            for ret, answer in answers:
                pipe.rpush(ret, answer)
            for env, expires, dst in routed:
                uid = f"{dst}.{await self._counters.next(dst)}"
                tries = min(env.try_, self.config.max_try)
                request = env.copy(uid=uid, src=self.twin, dst=[dst], try_=tries).encode()
                pipe.hset(keys.BUS_BACKLOG, uid, request)
                pipe.zadd(keys.bus_expiry(), {uid: expires})
                if dst == self.twin:
                    local = env.copy(uid=uid, src=self.twin, dst=[dst], ret=keys.BUS_REPLY)
                    pipe.rpush(keys.BUS_REMOTE, local.encode())
                else:
                    item = Outbound(
                        due=0.0,
                        id=f"req:{uid}",
                        kind=Kind.REQUEST,
                        to=dst,
                        body=request,
                        deadline=expires,
                        tries=tries,
                        uid=uid,
                    )
                    pipe.hset(keys.bus_outbox(), item.id, item.to_json())
                    outbound.append(item)
            self.store.release(pipe, keys.BUS_LOCAL, len(batch))
            await pipe.execute()
        for item in outbound:
            await self.forwarder.submit(item)

    async def _handle_remote(self, batch: list[bytes]) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            for raw in batch:
                # Entries were validated on the way in (HTTP or local loop); only cmd is needed.
                cmd = _command_of(raw)
                if not cmd:
                    log.warning("bus: dropped an entry of %s without a valid cmd", keys.BUS_REMOTE)
                    continue
                pipe.rpush(keys.bus_command(cmd), raw)
            self.store.release(pipe, keys.BUS_REMOTE, len(batch))
            await pipe.execute()

    async def _handle_reply(self, batch: list[bytes]) -> None:
        mine: list[Envelope] = []
        outbound: list[Outbound] = []
        invalid: list[tuple[str, str]] = []  # (uid, error) of unparseable replies
        now = time.time()
        for raw in batch:
            try:
                env = envelope.decode(raw, reply=True, max_size=self.config.max_size)
            except EnvelopeError as exc:
                uid = _salvage_uid(raw)
                log.warning("bus: invalid reply %r: %s", uid, exc)
                if uid:
                    invalid.append((uid, exc.public_message))
                continue
            if env.dst[0] == self.twin:
                mine.append(env)
            else:
                exp = min(env.exp or self.config.default_exp, self.config.max_exp)
                outbound.append(
                    Outbound(
                        due=0.0,
                        id=f"reply:{env.dst[0]}:{env.uid}",
                        kind=Kind.REPLY,
                        to=env.dst[0],
                        body=env.encode(),
                        deadline=now + exp,
                        tries=self.config.max_try,
                        uid=env.uid,
                    )
                )
        uids = [env.uid for env in mine] + [uid for uid, _ in invalid]
        originals = await self.store.backlog(uids)
        async with self.redis.pipeline(transaction=True) as pipe:
            for env, original in zip(mine, originals, strict=False):
                if original is None:
                    log.warning("bus: reply %s matches no pending request (late?)", env.uid)
                    continue
                request = envelope.load_trusted(original)
                answer = env.copy(ret=request.ret).encode()
                await self.store.finish_in(pipe, env.uid, request.ret, answer, f"req:{env.uid}")
            for (uid, text), original in zip(invalid, originals[len(mine) :], strict=True):
                if original is None:
                    continue
                request = envelope.load_trusted(original)
                fail = envelope.error_reply(
                    request, f"invalid reply: {text}", about=request.dst[0], me=self.twin
                )
                await self.store.finish_in(pipe, uid, request.ret, fail.encode(), f"req:{uid}")
            for item in outbound:
                pipe.hset(keys.bus_outbox(), item.id, item.to_json())
            self.store.release(pipe, keys.BUS_REPLY, len(batch))
            await pipe.execute()
        for item in outbound:
            await self.forwarder.submit(item)

    # --- outbound outcomes, recovery, expiry --------------------------------

    async def _forwarded(self, item: Outbound, outcome: Outcome, text: str) -> None:
        """Final outcome of one POST: drop it from the outbox, answer ``ret`` if it failed."""
        try:
            if outcome is Outcome.DELIVERED:
                await self.store.drop_outbox(item.id)
                return
            if item.kind is Kind.REPLY:
                log.error("bus: reply %s to twin %s lost: %s", item.uid, item.to, text)
                await self.store.drop_outbox(item.id)
                return
            request = envelope.load_trusted(item.body)
            fail = envelope.error_reply(request, text, about=item.to, me=self.twin)
            await self.store.finish(item.uid, request.ret, fail.encode(), item.id)
            await self.store.drop_outbox(item.id)
        except _REDIS_ERRORS:
            # It stays in the outbox: resent on restart, or expired by the scrubber.
            log.exception("bus: could not record outcome of %s", item.id)

    async def _resend_outbox(self) -> None:
        items = await self.store.outbox_items(self.config.max_pending)
        for outbox_id, raw in items:
            try:
                item = Outbound.from_json(outbox_id, raw)
            except (ValueError, KeyError, TypeError):
                log.error("bus: dropping corrupt outbox entry %s", outbox_id)
                await self.store.drop_outbox(outbox_id)
                continue
            await self.forwarder.submit(item)
        if items:
            log.info("bus: resending %d pending outbound envelopes", len(items))

    async def _scrubber(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.config.scrub_interval_s)
            try:
                await self.scrub(time.time())
            except _REDIS_ERRORS as exc:
                reraise_if_cancelling(exc)
                log.warning("bus: scrubber: redis error %r", exc)

    async def scrub(self, now: float) -> int:
        """Answer expired backlog entries with ``err``; returns how many were answered."""
        uids = await self.store.expired(now, 500)
        answered = 0
        if uids:
            originals = await self.store.backlog(uids)
            async with self.redis.pipeline(transaction=False) as pipe:
                for uid, original in zip(uids, originals, strict=True):
                    if original is None:
                        pipe.zrem(keys.bus_expiry(), uid)
                        continue
                    request = envelope.load_trusted(original)
                    fail = envelope.error_reply(
                        request, "request expired", about=request.dst[0], me=self.twin
                    )
                    await self.store.finish_in(pipe, uid, request.ret, fail.encode(), f"req:{uid}")
                    answered += 1
                await pipe.execute()
        await self.store.forget_seen(now)
        return answered


class UidCounters:
    """Per-destination counters for uids ``dst.counter``, reserved from Redis in blocks.

    ``INCRBY msgbus.system.counter.<dst> BLOCK`` reserves the next BLOCK values,
    handed out from memory; a restart skips the rest of a block, so uids stay
    unique (with gaps) without a Redis round trip per request.
    """

    BLOCK = 100
    MAX_TWINS = 10_000

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._ranges: dict[int, list[int]] = {}  # dst -> [next, end)

    async def next(self, dst: int) -> int:
        span = self._ranges.get(dst)
        if span is None or span[0] >= span[1]:
            top = int(await self._redis.incrby(keys.bus_counter(dst), self.BLOCK))
            if len(self._ranges) >= self.MAX_TWINS:
                self._ranges.clear()
            span = self._ranges[dst] = [top - self.BLOCK + 1, top + 1]
        value = span[0]
        span[0] += 1
        return value


def reraise_if_cancelling(exc: BaseException) -> None:
    """redis-py may turn a cancellation into a connection error: never swallow a cancel."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


def _command_of(raw: bytes) -> str:
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        doc = json.loads(raw)
        cmd = doc.get("cmd") if isinstance(doc, dict) else None
        if isinstance(cmd, str) and cmd and not cmd.startswith(envelope.RESERVED_PREFIX):
            return cmd
    return ""


def _salvage_uid(raw: bytes) -> str:
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        doc = json.loads(raw)
        if isinstance(doc, dict) and isinstance(doc.get("uid"), str):
            return str(doc["uid"])
    return ""
