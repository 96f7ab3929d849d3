"""The chain feed over a Dialogue duplex on TCP (seed 004, "Other transports").

A client opens a duplex whose initial data is the JSON params of
``cardinal_subscribe`` (``["streams", "0xNUM", "0xHASH", [patterns],
{options}?]``). The server answers on the duplex with one message per result
object (``batch``, ``subbatch`` and the opt-in ``ready``/``reorg``), exactly
the JSON of the websocket notifications' ``result``, produced by the same
:class:`~pipeline.chain.history.resumption.TieredResumption` and bounded the same
way. Bad params end the duplex with a JSON-RPC error object as error data; a
subscriber that falls behind is ended with ``subscriber too slow``.

A connection is served at most ``MAX_SUBSCRIPTIONS`` duplexes at once, as a
websocket connection its subscriptions (more are ended at once with a JSON-RPC
error object), and what they hold queued is bounded together
(:class:`Feed`, a :class:`~pipeline.chain.outbox.Budget` per connection): at
most ``send_buffer`` messages and :data:`CONNECTION_BYTES` bytes across all of
them, whatever their number (each duplex's own outbox is bounded too). A
catch-up waits for room in both, and is ended as too slow when none comes
within ``stall_s``; a live block that does not fit ends its duplex at once.
Before, each of up to 1,024 duplexes had its own 4,096 messages and one
connection grew the server by over a gigabyte.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from pipeline.blockcodec import KeyTest
from pipeline.chain import jsonrpc
from pipeline.chain.cardinal import SEED, encoding_for
from pipeline.chain.history.resumption import TieredResumption
from pipeline.chain.outbox import Budget, Outbox
from pipeline.chain.planning import Plan
from pipeline.chain.serve.subscription import SubscribeParams, Subscription, parse_subscribe
from pipeline.chain.serve.wsconn import MAX_SUBSCRIPTIONS
from pipeline.dialogue.connection import Connection
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.server import DialogueServer
from pipeline.errors import (
    BadParams,
    DialogueError,
    PeerLeft,
    ResumptionError,
    SlowConsumer,
)

log = logging.getLogger(__name__)

#: Bytes the duplexes of one Dialogue connection may hold queued together.
CONNECTION_BYTES = 8 << 20
#: Told each Redis error that ends a duplex (``sluice serve`` counts them by kind).
RedisErrors = Callable[[BaseException], None]
_TOO_MANY = jsonrpc.error(
    None, jsonrpc.SERVER_ERROR, f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection"
).encode()


class Feed:
    """The feed's duplexes, one :class:`Budget` per Dialogue connection, and their figures."""

    def __init__(
        self,
        send_buffer: int,
        max_bytes: int = CONNECTION_BYTES,
        on_redis_error: RedisErrors | None = None,
    ) -> None:
        self.send_buffer = send_buffer
        self.max_bytes = max_bytes
        #: told each Redis error that ended a duplex (serve counts them by kind)
        self.on_redis_error = on_redis_error
        #: per connection: its budget and how many of its duplexes are served
        self._budgets: dict[object, tuple[Budget, int]] = {}
        self.server: DialogueServer | None = None
        #: the most one connection's duplexes held queued at once (bytes)
        self.peak_bytes = 0

    def enter(self, host: object) -> Budget | None:
        """One more duplex served on ``host`` (its connection): the connection's budget;
        None when it already has :data:`MAX_SUBSCRIPTIONS` served (the duplex is refused)."""
        budget, count = self._budgets.get(host) or (Budget(self.send_buffer, self.max_bytes), 0)
        if count >= MAX_SUBSCRIPTIONS:
            return None
        self._budgets[host] = (budget, count + 1)
        return budget

    def leave(self, host: object) -> None:
        budget, count = self._budgets[host]
        self.peak_bytes = max(self.peak_bytes, budget.peak_bytes)
        if count > 1:
            self._budgets[host] = (budget, count - 1)
        else:
            del self._budgets[host]

    def figures(self) -> dict[str, float]:
        """Connections, duplexes served, and what they hold queued, for ``/metrics``."""
        budgets = [b for b, _n in self._budgets.values()]
        return {
            "sluice_serve_dialogue_connections_open": len(self.server.connections)
            if self.server is not None
            else len(budgets),
            "sluice_serve_dialogue_duplexes_open": sum(n for _b, n in self._budgets.values()),
            "sluice_serve_dialogue_queued_messages": sum(b.messages for b in budgets),
            "sluice_serve_dialogue_queued_bytes": sum(b.nbytes for b in budgets),
        }


async def serve_duplex(
    resumption: TieredResumption,
    duplex: Duplex,
    *,
    send_buffer: int,
    stall_s: float | None = None,
    budget: Budget | None = None,
    on_redis_error: RedisErrors | None = None,
) -> None:
    """Serve one subscription on an incoming duplex until the peer leaves or falls behind
    (``budget``: what it may queue, shared with the other duplexes of its connection;
    ``on_redis_error``: told each Redis error that ends it)."""
    parsed = _parse(duplex.initial or b"null")
    if isinstance(parsed, bytes):
        await duplex.end(error=parsed)
        return
    keep = encoding_for(parsed.keep, SEED, parsed.weight)  # the seed shape; weight if asked
    plan = await _plan(resumption, parsed, keep, on_redis_error)
    if isinstance(plan, bytes):
        await duplex.end(error=plan)
        return
    outbox = Outbox(send_buffer, stall_s=stall_s, budget=budget)
    sub = Subscription("0x1", parsed, outbox, envelope=False)
    try:
        await _feed(resumption, duplex, outbox, plan, keep, sub, on_redis_error)
    finally:
        outbox.clear()  # what it held goes back to its connection's budget


def _invalid(text: str) -> bytes:
    """The JSON-RPC "invalid params" error object a refused duplex ends with."""
    return jsonrpc.error(None, jsonrpc.INVALID_PARAMS, text).encode()


def _parse(initial: bytes) -> SubscribeParams | bytes:
    """The subscription the duplex's initial data asks for, or the error to end it with."""
    try:
        if len(initial) > jsonrpc.MAX_CHARS:
            raise BadParams(f"params longer than {jsonrpc.MAX_CHARS} bytes")
        # Bounded like the websocket's requests: a nesting bomb is refused by a linear
        # pre-scan, never handed to Python's recursive decoder.
        params = jsonrpc.loads_bounded(initial)
    except ValueError as exc:  # not JSON, or nested too deep (the decoder's text stays here)
        deep = str(exc).startswith("nested deeper")
        return _invalid(f"invalid params: {exc}" if deep else "invalid params: not JSON")
    except BadParams as exc:
        return _invalid(exc.public_message)
    try:
        return parse_subscribe(params)
    except BadParams as exc:
        return _invalid(exc.public_message)


async def _plan(
    resumption: TieredResumption,
    parsed: SubscribeParams,
    keep: KeyTest | None,
    on_redis_error: RedisErrors | None,
) -> Plan | bytes:
    """Where the subscription starts, or the error to end the duplex with (public text only)."""
    try:
        return await resumption.resolve(parsed.num, parsed.hash, keep)
    except BadParams as exc:
        return _invalid(exc.public_message)
    except ResumptionError as exc:  # only the public text crosses the wire
        log.info("dialogue subscription refused: %r", exc)
        return jsonrpc.error(None, jsonrpc.SERVER_ERROR, exc.public_message).encode()
    except (aioredis.RedisError, OSError) as exc:
        log.warning("dialogue subscription: redis error %r", exc)
        if on_redis_error is not None:
            on_redis_error(exc)
        error = jsonrpc.error(None, jsonrpc.SERVER_ERROR, "redis unavailable, retry later")
        return error.encode()


async def _feed(
    resumption: TieredResumption,
    duplex: Duplex,
    outbox: Outbox,
    plan: Plan,
    keep: KeyTest | None,
    sub: Subscription,
    on_redis_error: RedisErrors | None = None,
) -> None:
    """Stream the plan into the duplex until the peer leaves, falls behind or resumption fails."""

    async def write() -> None:
        # A text leaves the outbox (and its connection's budget) once sent, not before:
        # texts popped by the hundred and held here were outside every bound.
        while True:
            await outbox.wait()
            while (text := outbox.peek()) is not None:
                await duplex.send(text)
                outbox.pop()

    async def watch() -> None:
        async for _ in duplex:
            pass  # a subscriber sends nothing more; the end of its half means it left
        raise PeerLeft

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(write())
            group.create_task(watch())
            group.create_task(resumption.stream(plan, keep, sub))
    except* PeerLeft:
        pass
    except* (DialogueError, ConnectionError) as gone:
        # The subscriber went away mid-send (a closed duplex or connection): one line,
        # not a traceback of the task group.
        log.info("dialogue subscriber gone: %r", gone.exceptions[0])
    except* SlowConsumer:
        await duplex.end(error=b"subscriber too slow: send buffer full")
    except* ResumptionError as group_exc:
        first = group_exc.exceptions[0]
        log.warning("dialogue subscription ended: %r", first)
        text = first.public_message if isinstance(first, ResumptionError) else "cannot resume"
        await duplex.end(error=text.encode()[:200])
    except* (aioredis.RedisError, OSError) as group_exc:  # a catch-up's read of the tail
        lost = group_exc.exceptions[0]
        log.warning("dialogue subscription: redis error %r", lost)
        if on_redis_error is not None:
            on_redis_error(lost)
        await duplex.end(error=b"redis unavailable, resubscribe later")


def dialogue_server(
    resumption: TieredResumption,
    host: str,
    port: int,
    *,
    send_buffer: int,
    stall_s: float | None = None,
    feed: Feed | None = None,
) -> DialogueServer:
    """The feed's server; ``feed`` (made here when not given) keeps its budgets and figures."""
    state = feed if feed is not None else Feed(send_buffer)

    async def on_duplex(duplex: Duplex) -> None:
        budget = state.enter(duplex.host)
        if budget is None:  # as a websocket connection's subscriptions are bounded
            await duplex.end(error=_TOO_MANY)
            return
        try:
            await serve_duplex(
                resumption,
                duplex,
                send_buffer=send_buffer,
                stall_s=stall_s,
                budget=budget,
                on_redis_error=state.on_redis_error,
            )
        finally:
            state.leave(duplex.host)

    server = DialogueServer(host, port, on_duplex=on_duplex)
    state.server = server
    return server


async def subscribe_dialogue(
    host: str,
    port: int,
    from_num: int,
    from_hash: bytes | None = None,
    prefixes: Sequence[str] = (),
    options: dict[str, bool] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Result objects (``batch``, ``subbatch``...) of one subscription over Dialogue.

    ``from_hash`` None (no block known yet) sends the zero hash, as the
    websocket consumer does: the server resumes from ``from_num``'s canonical block.
    """
    block_hash = from_hash if from_hash is not None else bytes(32)
    params: list[Any] = ["streams", hex(from_num), "0x" + block_hash.hex(), list(prefixes)]
    if options:
        params.append(options)
    conn = await Connection.connect(host, port)
    try:
        async with conn.duplex(json.dumps(params).encode()) as duplex:
            async for data in duplex:
                result: dict[str, Any] = json.loads(data)
                yield result
    finally:
        await conn.close()
