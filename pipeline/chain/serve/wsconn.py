"""One websocket connection of ``sluice serve``: JSON-RPC requests in, notifications out.

A :class:`Connection` reads requests (each in its own bounded task), answers
them through one bounded :class:`~pipeline.chain.outbox.Outbox` drained
by one writer task (its sending half, :mod:`pipeline.chain.serve.wswrite`), and
runs the subscriptions it opened. A batch array is answered with one array
(see :mod:`pipeline.chain.jsonrpc`); each of its calls is admitted and run as
the same request alone would be (its own task, counted against
``MAX_IN_FLIGHT`` and ``MAX_IN_FLIGHT_SERVER``, refused in its place when there
is no room) and keeps its place in flight until the batch's reply is queued,
as the replies of that many lone requests would wait in the send buffer. The
calls of a batch run concurrently (JSON-RPC 2.0 allows any order), so a batch's
elements must not depend on each other; a subscription opened in a batch starts
after the batch's reply, so its notifications always follow it. The app around it
(routes, auth, lifecycle, the live tailer) is :mod:`pipeline.chain.serve.server`;
the wire dialects are :mod:`pipeline.chain.cardinal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from aiohttp import WSCloseCode, WSMsgType, web

from pipeline.blockcodec import MAX_BLOCK_NUM, parse_quantity
from pipeline.chain import jsonrpc
from pipeline.chain.cardinal import (
    CARDINAL,
    DIALECTS,
    SEED,
    STREAMS_BLOCK,
    encoding_for,
    whole_block_result,
)
from pipeline.chain.planning import Reason
from pipeline.chain.serve.appkeys import CALLS, HUB, METRICS, RESUMPTION, SETTINGS
from pipeline.chain.serve.subscription import Subscription, parse_subscribe
from pipeline.chain.serve.wswrite import Sending
from pipeline.errors import (
    BadBatch,
    BadParams,
    NotFound,
    ReorgReconnect,
    SlowConsumer,
    SluiceError,
)

log = logging.getLogger(__name__)

MAX_FRAME = 64 * 1024
MAX_SUBSCRIPTIONS = 16
#: Requests of one connection being worked on at once; more are refused with an
#: error reply while the reader goes on reading (so pings and pongs still flow).
MAX_IN_FLIGHT = 64
#: Requests being worked on in the whole server; more are refused the same way, so
#: thousands of connections cannot queue unbounded work in front of live data.
MAX_IN_FLIGHT_SERVER = 1024
CLOSE_TIMEOUT_S = 2.0
#: Refused requests logged per connection (later ones are only counted).
_REFUSALS_LOGGED = 16

Handler = Callable[["Connection", Any], Any]
#: What one call comes to: its reply text, and the id of the subscription it opened (if any),
#: to start once that reply is queued.
Answer = tuple[str, str | None]


def dialect_of(request: web.Request) -> str | None:
    """The wire dialect the URL asks for (``/cardinal``, ``?dialect=``), None if unknown."""
    default = CARDINAL if request.path == "/cardinal" else SEED
    name = request.query.get("dialect", default)
    return name if name in DIALECTS else None


class Connection(Sending):
    """One websocket peer: reads requests, owns its subscriptions and its writer (:class:`Sending`)."""

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        app = request.app
        self.settings = app[SETTINGS]
        super().__init__(
            ws,
            request.transport,
            app[METRICS],
            send_buffer=self.settings.serve.send_buffer,
            batch=app[HUB].batch,
            stall_s=self.settings.serve.stall_s,
            heartbeat_s=self.settings.serve.heartbeat_s,
        )
        self.request = request
        self.resumption = app[RESUMPTION]
        self.dialect = dialect_of(request) or SEED
        self.subs: dict[str, tuple[Subscription, asyncio.Task[None]]] = {}
        self._next_sub = 0
        #: Subscriptions resolved and answered, not started yet (until their batch's reply).
        self._unstarted: dict[str, tuple[Subscription, Any]] = {}
        #: Requests being worked on (at most MAX_IN_FLIGHT), each its own task; a batch's
        #: stay here until the batch's reply is queued.
        self._calls: set[asyncio.Task[Any]] = set()
        #: Batches waiting for their calls (each holds at least one of ``_calls``).
        self._batches: set[asyncio.Task[None]] = set()
        self._subscribing = 0
        self._refusals_logged = 0

    # --- lifecycle ----------------------------------------------------------

    async def run(self) -> None:
        writer = asyncio.create_task(self._write(), name="ws-writer")
        reader = asyncio.create_task(self._read(), name="ws-reader")
        try:
            waits: set[asyncio.Future[Any]] = {reader, writer, self._failure}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for _, task in self.subs.values():
                task.cancel()
            reader.cancel()
            writer.cancel()
            for call in (*self._calls, *self._batches):
                call.cancel()
            await asyncio.gather(
                reader,
                writer,
                *self._calls,
                *self._batches,
                *(t for _, t in self.subs.values()),
                return_exceptions=True,
            )
            self.subs.clear()
            code, reason = self._failure.result() if self._failure.done() else (WSCloseCode.OK, "")
            await self.close(code, reason)

    async def close(self, code: int, reason: str) -> None:
        log.debug("closing %s %s closed=%s", code, reason, self.ws.closed)
        if self.ws.closed:
            return
        try:
            async with asyncio.timeout(self.linger_s or CLOSE_TIMEOUT_S):
                await self.ws.close(code=code, message=reason.encode()[:123])
        except (TimeoutError, ConnectionError) as exc:
            log.debug("close failed %r; aborting %s", exc, self.request.transport)
            transport = self.request.transport
            if transport is not None:
                transport.abort()

    async def _read(self) -> None:
        """Read frames without ever waiting for a request to finish.

        Each request runs in its own task (at most ``MAX_IN_FLIGHT``); the loop
        goes straight back to ``receive``, where pings are answered and pongs
        noted (:meth:`heard`), so a burst of slow calls cannot starve the heartbeat.
        """
        async for msg in self.ws:
            if await self.heard(msg):  # a ping (answered) or a pong: the heartbeat's
                continue
            if msg.type == WSMsgType.TEXT:
                self._dispatch(msg.data)
            elif msg.type == WSMsgType.BINARY:
                self._error(None, jsonrpc.PARSE_ERROR, "binary frames are not JSON-RPC: send text")
            elif msg.type == WSMsgType.ERROR:
                self.fail(WSCloseCode.MESSAGE_TOO_BIG, "frame too large or invalid")
                return

    # --- requests -----------------------------------------------------------

    def _reply(self, text: str) -> None:
        if not self.outbox.offer([text.encode()]):
            self._slow()

    def _error(self, req_id: jsonrpc.RequestId, code: int, message: str) -> None:
        self._reply(self._error_text(req_id, code, message))

    def _error_text(self, req_id: jsonrpc.RequestId, code: int, message: str) -> str:
        self.metrics.inc_label("sluice_serve_rpc_errors_total", "code", str(code))
        return jsonrpc.error(req_id, code, message)

    def _refused(self, err: jsonrpc.RpcError) -> str:
        self._log_refusal("refused a request: %s", err.message)
        return self._error_text(err.id, err.code, err.message)

    def _log_refusal(self, fmt: str, *args: object) -> None:
        """Log a refused request, at most ``_REFUSALS_LOGGED`` per connection (a flood is counted
        in ``sluice_serve_rpc_errors_total``, not written to the log line by line)."""
        if self._refusals_logged < _REFUSALS_LOGGED:
            self._refusals_logged += 1
            log.info(fmt + " (%s)", *args, self.request.remote)

    def _dispatch(self, text: str) -> None:
        """Parse one frame (bounded: see ``jsonrpc.parse_message``) and start its call or calls."""
        msg = jsonrpc.parse_message(text)
        if isinstance(msg, jsonrpc.Batch):
            self._dispatch_batch(msg)
        elif isinstance(msg, jsonrpc.RpcError):
            self._reply(self._refused(msg))
        elif not msg.is_notification:  # a notification gets no reply (none of our methods is one)
            admitted = self._admit(msg)
            if isinstance(admitted, str):
                self._reply(admitted)
            else:
                task = self._run(msg, self._handle(msg, admitted))
                task.add_done_callback(self._untrack)

    def _dispatch_batch(self, batch: jsonrpc.Batch) -> None:
        """Start every call of a batch; its reply, one array, is queued when all of them are done."""
        answers: list[str | asyncio.Task[Answer]] = []
        for item in batch.items:
            if isinstance(item, jsonrpc.RpcError):
                answers.append(self._refused(item))
            elif not item.is_notification:
                admitted = self._admit(item)
                answers.append(
                    admitted
                    if isinstance(admitted, str)
                    else self._run(item, self._call(item, admitted))
                )
        calls = [a for a in answers if not isinstance(a, str)]
        if not calls:
            self._reply_batch([a for a in answers if isinstance(a, str)], [])
            return
        waiter = asyncio.create_task(self._gather_batch(answers), name="rpc-batch")
        self._batches.add(waiter)
        waiter.add_done_callback(functools.partial(self._batch_done, calls))

    def _admit(self, req: jsonrpc.Request) -> Handler | str:
        """The handler of a request that may run now, or the text of its refusal."""
        handler = _METHODS.get(req.method)
        if handler is None:
            return self._error_text(
                req.id, jsonrpc.METHOD_NOT_FOUND, f"method not found: {req.method[:64]}"
            )
        if (
            len(self._calls) >= MAX_IN_FLIGHT
            or len(self.request.app[CALLS]) >= MAX_IN_FLIGHT_SERVER
        ):
            self.metrics.inc("sluice_serve_requests_refused_total")
            busy = len(self._calls) < MAX_IN_FLIGHT
            return self._error_text(
                req.id,
                jsonrpc.SERVER_ERROR,
                "server busy: retry later"
                if busy
                else f"too many requests in flight (at most {MAX_IN_FLIGHT}): wait for replies",
            )
        return handler

    def _run(self, req: jsonrpc.Request, work: Any) -> asyncio.Task[Any]:
        """Start one admitted call, counted in flight (for this connection and the server)."""
        task: asyncio.Task[Any] = asyncio.create_task(work, name=f"rpc-{req.method[:32]}")
        self._calls.add(task)
        self.request.app[CALLS].add(task)
        return task

    def _untrack(self, task: asyncio.Task[Any]) -> None:
        self._calls.discard(task)
        self.request.app[CALLS].discard(task)

    def _batch_done(self, calls: list[asyncio.Task[Answer]], waiter: asyncio.Task[None]) -> None:
        self._batches.discard(waiter)
        for call in calls:
            self._untrack(call)

    async def _gather_batch(self, answers: list[str | asyncio.Task[Answer]]) -> None:
        texts: list[str] = []
        starts: list[str] = []
        for answer in answers:
            if isinstance(answer, str):
                texts.append(answer)
                continue
            text, sub_id = await answer
            texts.append(text)
            if sub_id is not None:
                starts.append(sub_id)
        self._reply_batch(texts, starts)

    def _reply_batch(self, texts: list[str], starts: list[str]) -> None:
        reply = jsonrpc.batch_reply(texts)
        if reply is not None:  # None: every element was a notification
            self._reply(reply)
        for sub_id in starts:
            self._start(sub_id)

    async def _handle(self, req: jsonrpc.Request, handler: Handler) -> None:
        """Run one lone call: reply, then start the subscription it opened."""
        text, sub_id = await self._call(req, handler)
        self._reply(text)
        if sub_id is not None:
            self._start(sub_id)

    async def _call(self, req: jsonrpc.Request, handler: Handler) -> Answer:
        """Run one call; its errors become reply texts here, the one boundary to the wire.

        Only ``public_message`` texts (and the texts of :class:`BadParams`,
        which describe the peer's own input) are sent; details go to the log.
        """
        try:
            value = await handler(self, req.params)
        except BadParams as exc:
            self._log_refusal("request %s: invalid params: %s", req.method[:64], exc)
            code, message = jsonrpc.INVALID_PARAMS, exc.public_message
        except NotFound as exc:
            code, message = exc.code, exc.public_message
        except SluiceError as exc:
            log.info("request %s refused: %r", req.method, exc)
            code, message = jsonrpc.SERVER_ERROR, exc.public_message
        except (aioredis.RedisError, OSError) as exc:
            log.warning("request %s failed: %r", req.method, exc)
            self.metrics.redis_error(exc)
            code, message = jsonrpc.SERVER_ERROR, "redis unavailable, retry later"
            if self.dialect == CARDINAL and req.method == "cardinal_subscribe":
                # the library waits for a subscription id forever after an error reply:
                # closed, it redials and subscribes again
                self.fail(WSCloseCode.TRY_AGAIN_LATER, "redis unavailable, resubscribe later")
        except Exception:
            # Whatever a message can cause ends here, logged: the connection and
            # its subscriptions go on.
            log.exception("request %s failed", req.method)
            self.metrics.inc("sluice_serve_internal_errors_total")
            code, message = jsonrpc.INTERNAL_ERROR, "internal error"
        else:
            sub_id = str(value) if req.method == "cardinal_subscribe" else None
            return jsonrpc.result(req.id, value), sub_id
        return self._error_text(req.id, code, message), None

    async def subscribe(self, params: Any) -> str:
        parsed = parse_subscribe(params)
        if len(self.subs) + len(self._unstarted) + self._subscribing >= MAX_SUBSCRIPTIONS:
            raise BadParams(f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection")
        if parsed.num > MAX_BLOCK_NUM:
            raise BadParams(f"block number: at most {hex(MAX_BLOCK_NUM)}")
        self._subscribing += 1
        try:
            keep = encoding_for(parsed.keep, self.dialect, parsed.weight)
            plan = await self.resumption.resolve(parsed.num, parsed.hash, keep)
        finally:
            self._subscribing -= 1
        self._next_sub += 1
        sub_id = hex(self._next_sub)
        # Not started where the subscriber said it was: the cardinal dialect names the block below.
        moved = plan.reason in (Reason.REWIND, Reason.FORK) and (parsed.num, parsed.hash) != (
            0,
            bytes(32),
        )
        sub = Subscription(
            sub_id,
            parsed,
            self.outbox,
            dialect=self.dialect,
            announce=moved,
            deep_reorg=self.settings.lake.reorg_threshold,
        )
        self._unstarted[sub_id] = (sub, plan)
        return sub_id

    def _start(self, sub_id: str) -> None:
        entry = self._unstarted.pop(sub_id, None)
        if entry is None:
            return  # unsubscribed before its batch's reply
        sub, plan = entry
        task = asyncio.create_task(self._run_sub(sub, plan), name=f"sub-{sub_id}")
        self.subs[sub_id] = (sub, task)
        self.metrics.inc("sluice_serve_subscriptions_open")

    async def _run_sub(self, sub: Subscription, plan: Any) -> None:
        try:
            await self.resumption.stream(plan, sub.keep, sub)
        except ReorgReconnect as exc:  # the library redials from its last block
            self.metrics.inc("sluice_serve_reorg_reconnects_total")
            self.fail(WSCloseCode.SERVICE_RESTART, exc.public_message)
        except SlowConsumer:
            self._slow()
        except SluiceError as exc:
            log.warning("subscription %s ended: %r", sub.id, exc)
            self.fail(WSCloseCode.INTERNAL_ERROR, f"subscription {sub.id}: {exc.public_message}")
        except (aioredis.RedisError, OSError) as exc:
            log.warning("subscription %s: redis error %r", sub.id, exc)
            self.metrics.redis_error(exc)
            self.fail(WSCloseCode.TRY_AGAIN_LATER, "redis unavailable, resubscribe later")
        except Exception:
            log.exception("subscription %s failed", sub.id)
            self.metrics.inc("sluice_serve_internal_errors_total")
            self.fail(WSCloseCode.INTERNAL_ERROR, f"subscription {sub.id}: internal error")
        finally:
            self.metrics.inc("sluice_serve_subscriptions_open", -1)

    async def unsubscribe(self, params: Any) -> bool:
        if not isinstance(params, list) or len(params) != 1 or not isinstance(params[0], str):
            raise BadParams('params must be ["0xID"]')
        entry = self.subs.pop(params[0], None)
        if entry is None:
            if self._unstarted.pop(params[0], None) is not None:
                return True  # opened in a batch still running: never started
            if self.dialect == CARDINAL:
                raise NotFound("subscription not found")  # as cardinal-rpc answers
            return False
        entry[1].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await entry[1]
        return True

    async def get_block(self, params: Any) -> list[Any] | None:
        num = _block_number(params)
        texts = await self.resumption.get_block(num, encoding_for(None, self.dialect, False))
        return None if texts is None else [json.loads(t) for t in texts]

    async def streams_block(self, params: Any) -> Any:
        """``cardinal_streamsBlock``: the library's ``StreamsBlock`` (one ``batch``, all values)."""
        num = _block_number(params)
        found = await self.resumption.get_block_raw(num)
        if found is None:
            raise NotFound("block not found", code=jsonrpc.HANDLER_ERROR)
        return whole_block_result(*found)

    async def rpc_modules(self, params: Any) -> dict[str, str]:
        """``rpc_modules``, as cardinal-rpc answers it: every namespace served, at "1.0"."""
        return {name.split("_", 1)[0]: "1.0" for name in _METHODS}

    async def rpc_methods(self, params: Any) -> list[str]:
        """``rpc_methods``: every method name served."""
        return sorted(_METHODS)


def _block_number(params: Any) -> int:
    """The one ``["0xNUM"]`` parameter of a block query; :class:`BadParams` otherwise."""
    if not isinstance(params, list) or len(params) != 1:
        raise BadParams('params must be ["0xNUM"]')
    try:
        num = parse_quantity(params[0])
    except BadBatch as exc:
        raise BadParams(f"block number: {exc}") from exc
    if num > MAX_BLOCK_NUM:
        raise BadParams(f"block number: at most {hex(MAX_BLOCK_NUM)}")
    return num


_METHODS: dict[str, Callable[[Connection, Any], Any]] = {
    "cardinal_subscribe": Connection.subscribe,
    "cardinal_unsubscribe": Connection.unsubscribe,
    "cardinal_getBlock": Connection.get_block,
    STREAMS_BLOCK: Connection.streams_block,
    "rpc_modules": Connection.rpc_modules,
    "rpc_methods": Connection.rpc_methods,
}
