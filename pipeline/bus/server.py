"""The Python bus server: async handlers for ``msgbus.$cmd`` queues.

::

    server = BusServer.from_url("redis://127.0.0.1:6379/0")

    @server.handler("wallet.balance")
    async def balance(data: bytes, request: Envelope) -> bytes:
        return b"42"

    await server.serve()   # until cancelled

A handler gets the decoded ``dat`` and the request envelope and returns the
reply payload. The reply follows the seed: ``src`` and ``dst`` swapped,
``dat`` the base64 payload, ``now`` the response time, pushed to
``msgbus.system.reply`` (or, with ``direct=True``, straight to ``ret``: the
no-bus baseline). A handler that raises :class:`HandlerError` answers with its
message in ``err``; any other exception is logged and answered with a generic
``err``; a handler still running when its request expires (``now + exp``,
``exp`` 0 meaning 300 s) is cancelled and answered ``err = "handler timed
out"``. Either way the server keeps serving. A request that does not decode
goes to the dead-letter list (:mod:`pipeline.bus.dead`).

A request is never only in a server's memory (:mod:`pipeline.bus.handling`):
it is moved to the server's handling list in Redis and leaves it with its
reply. When a server dies mid-call (``os._exit``, kill -9), another server of
the bus hands its requests to a handler again within ``handler_ttl_s``, with
``request.redelivered`` counting such redeliveries (delivery is at least once);
at the third death a request goes to the dead-letter list and its caller is
answered ``err = "handler failed: ..."``. A server that stops gracefully hands
its cancelled handlers' requests on the same way. A reply Redis does not
take because it is away or refusing writes (``maxmemory`` with ``noeviction``, a
replica, a failed RDB save) is pushed again with backoff for up to
:data:`REPLY_RETRY_S`, not dropped: its request was already taken (while Redis
refuses writes a server takes nothing: what waits stays in its queue).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
import redis.exceptions

from pipeline import keys, lifecycle
from pipeline.bus import dead
from pipeline.bus.config import bus_redis_url, reraise_if_cancelling
from pipeline.bus.envelope import Envelope, deadline, decode, encode_data
from pipeline.bus.handling import Claims
from pipeline.errors import EnvelopeError, HandlerError
from pipeline.loggate import LogGate
from pipeline.redisio import conn as redisconn

log = logging.getLogger(__name__)

Handler = Callable[[bytes, Envelope], Awaitable[bytes | str | None]]

HANDLER_FAILED = "handler failed"
HANDLER_TIMED_OUT = "handler timed out"
#: ``exp`` 0 means this many seconds (the bus's default).
DEFAULT_EXP_S = 300
#: Longest blocking wait (BLMPOP) of a worker, in seconds.
_WAIT_S = 1
#: Seconds a reply Redis refuses is pushed again before it is given up (logged).
REPLY_RETRY_S = DEFAULT_EXP_S


class BusServer:
    """Serves bus commands with async handlers (see the module docstring).

    ``async with BusServer.from_url(url) as server: await server.serve()``;
    :meth:`close` (safe twice, concurrently) stops a running :meth:`serve` and
    waits for it, then closes the Redis connections.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        workers: int = 4,
        batch: int = 32,
        direct: bool = False,
        handler_ttl_s: float = 10.0,
    ) -> None:
        self.redis = client
        #: This server's requests in Redis; its id is unique per server object.
        self.claims = Claims(client, uuid.uuid4().hex[:16], handler_ttl_s)
        self._closing = lifecycle.Once()
        self._stop = asyncio.Event()
        self._serving = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.workers = workers
        self.batch = batch
        self.direct = direct
        self.handlers: dict[str, Handler] = {}
        self.served = 0
        self.failed = 0
        #: Reply pushes repeated because Redis was away or refused writes.
        self.retried = 0
        #: Redis errors of the workers: one line per interval, one when they end.
        self._gate = LogGate(log)

    @classmethod
    def from_url(cls, url: str, **kwargs: float) -> BusServer:
        """A server on the bus whose Redis is ``url``; ``kwargs`` as the constructor's."""
        workers = int(kwargs.get("workers", 4))
        client = redisconn.connect(
            bus_redis_url(url),
            redisconn.Role.BUS_CLIENT,
            block_s=_WAIT_S,
            max_connections=workers + 8,
        )
        return cls(client, **kwargs)  # type: ignore[arg-type]

    async def __aenter__(self) -> BusServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop :meth:`serve` (handlers running are cancelled), wait for it, close Redis.

        Safe to call twice; a second caller waits for the first's close.
        """
        await self._closing.run(self._close)

    async def _close(self) -> None:
        self._stop.set()
        await self._idle.wait()
        try:  # what cancelled handlers held goes to a handler again
            await self.claims.release()
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("bus server: held requests not handed on (%r): redelivered later", exc)
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()

    def handler(self, cmd: str) -> Callable[[Handler], Handler]:
        """Register ``fn`` as the handler of ``cmd``."""
        keys.bus_command(cmd)  # validates

        def register(fn: Handler) -> Handler:
            self.handlers[cmd] = fn
            return fn

        return register

    async def serve(self) -> None:
        """Serve registered commands until cancelled or :meth:`close` is called."""
        if not self.handlers:
            raise HandlerError("no handler registered")
        if self._stop.is_set():
            raise HandlerError("the server is closed")
        self._serving += 1
        self._idle.clear()
        try:
            async with asyncio.TaskGroup() as group:
                queues = [keys.bus_command(cmd) for cmd in self.handlers]
                per_queue = max(1, self.workers // len(queues))
                # one claim waits per queue at a time: it takes all that came together
                # (as one BLMPOP would), not one item per waiting worker
                locks = {q: asyncio.Lock() for q in queues}
                tasks = [group.create_task(self._alive())]
                tasks += [group.create_task(self._worker(q, locks[q])) for q in queues * per_queue]
                await self._stop.wait()
                for task in tasks:
                    task.cancel()
        finally:
            self._serving -= 1
            if not self._serving:
                self._idle.set()

    async def _alive(self) -> None:
        """Renew this server's deadline; hand dead servers' requests to a handler again."""
        while True:
            try:
                await self.claims.alive()
                done = await self.claims.recover()
                if done.again or done.aside:
                    log.warning("bus server: a handler died mid-call: %d request(s) handed to "
                                "a handler again, %d set aside", done.again, done.aside)  # fmt: skip
            except (redis.exceptions.RedisError, OSError) as exc:
                reraise_if_cancelling(exc)
                self._gate.failed("worker", "bus server: redis error %r; retrying", exc)
            await asyncio.sleep(self.claims.ttl_s / 3)

    async def _worker(self, source: str, claiming: asyncio.Lock) -> None:
        pause = 0.1
        while True:
            try:
                async with claiming:
                    items = await self.claims.wait_claim(source, _WAIT_S, self.batch)
                self._gate.ended("worker", "bus server: redis works again")
                if not items:
                    continue
                await self._answer_batch(source, items)
                pause = 0.1
            except (redis.exceptions.RedisError, OSError) as exc:
                reraise_if_cancelling(exc)
                self._gate.failed("worker", "bus server: redis error %r; retrying", exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _answer_batch(self, source: str, items: list[tuple[bytes, int]]) -> None:
        """Run the handlers of one popped batch; send each reply once its handler is done.

        Replies finished together go out in one pipeline (with fast handlers, the
        whole batch); a slow handler delays no other request's reply.
        """
        raws = {asyncio.create_task(self._answer(raw, again)): (raw, again) for raw, again in items}
        pending: set[asyncio.Task[tuple[str, bytes]]] = set(raws)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                await self._deliver(source, [(*task.result(), *raws[task]) for task in done])
        finally:  # cancelled, or Redis failed: the handlers still running stop too
            for task in pending:
                task.cancel()

    async def _deliver(self, source: str, replies: list[tuple[str, bytes, bytes, int]]) -> None:
        """Push ``(target, reply, raw, redelivered)`` replies; set aside those with no target.

        What Redis refuses for now (:func:`pipeline.redisio.conn.unavailable`) is pushed
        again with backoff; a reply pushed twice is refused by the bus ("unknown uid").
        """
        todo = [(target, reply, raw, n) for target, reply, raw, n in replies if target]
        aside = [(why, raw, n) for target, why, raw, n in replies if not target]
        give_up = time.monotonic() + REPLY_RETRY_S
        pause = 0.1
        while todo or aside:
            try:
                results = await self._push(source, todo, aside)
            except (redis.exceptions.RedisError, OSError) as exc:
                reraise_if_cancelling(exc)
                if not redisconn.unavailable(exc):
                    raise
                results = [exc] * len(todo)
            aside = []  # dead letters are best effort: the bus's own list, not an answer
            again = []
            for (target, reply, raw, n), result in zip(todo, results[: len(todo)], strict=True):
                if not isinstance(result, Exception):
                    continue
                if redisconn.unavailable(result) and time.monotonic() < give_up:
                    again.append((target, reply, raw, n))
                else:
                    # One bad target (WRONGTYPE) must not cost the other replies.
                    log.error("bus server: reply to %s not delivered: %s", target, result)
            if again:
                why = next(r for r in results if isinstance(r, Exception))
                self._gate.failed(
                    "replies", "bus server: %d reply(ies) refused (%r); retrying", len(again), why
                )
            else:
                self._gate.ended("replies", "bus server: replies delivered again")
            todo = again
            if todo:
                self.retried += len(todo)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _push(
        self,
        source: str,
        sent: list[tuple[str, bytes, bytes, int]],
        aside: list[tuple[bytes, bytes, int]],
    ) -> list[object]:
        """The replies (their results first, in order) and the requests they answer out
        of the handling list, in one MULTI: a death leaves both or neither."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for target, reply, _, _ in sent:
                pipe.rpush(target, reply)
            for why, raw, n in aside:  # set aside, with the reason
                pipe.lpush(keys.bus_dead(), dead.entry(source, why.decode(), raw))
                pipe.ltrim(keys.bus_dead(), 0, dead.LIST_MAX - 1)
                self.claims.answered_in(pipe, raw, n)
            for _, _, raw, n in sent:
                self.claims.answered_in(pipe, raw, n)
            return list(await pipe.execute(raise_on_error=False))

    async def _answer(self, raw: bytes, redelivered: int = 0) -> tuple[str, bytes]:
        """``(target, reply)``; ``("", reason)`` for a request that does not decode."""
        try:
            request = decode(raw)
        except EnvelopeError as exc:
            log.warning("bus server: invalid request set aside: %s", exc)
            return "", str(exc).encode()
        request.redelivered = redelivered
        handler = self.handlers.get(request.cmd)
        err = ""
        payload: bytes | str | None = None
        if handler is None:
            err = f"no handler for {request.cmd}"
        else:
            received = time.time()
            expires = deadline(request, received=received, default_exp=DEFAULT_EXP_S, max_exp=86400)
            try:
                async with asyncio.timeout(max(expires - received, 0.0)):
                    payload = await handler(request.data, request)
            except TimeoutError:
                log.warning("bus server: handler of %s still running at expiry", request.cmd)
                err = HANDLER_TIMED_OUT
            except HandlerError as exc:
                err = exc.public_message
            except Exception:  # the boundary: log it all, send a generic text, keep serving
                log.exception("bus server: handler of %s failed", request.cmd)
                err = HANDLER_FAILED
        if err:
            self.failed += 1
        self.served += 1
        me = request.dst[0]
        reply = request.copy(
            src=me,
            dst=[request.src],
            dat=encode_data(payload or b""),
            now=int(time.time()),
            err=err,
        )
        target = request.ret if self.direct else keys.BUS_REPLY
        return target, reply.encode()
