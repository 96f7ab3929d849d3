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

A duplex ended as too slow gives back what it held queued at once, and no end
of the feed waits more than ``linger_s`` (:data:`SLOW_CLOSE_S`, as a websocket
closed with 1008) for its connection to take it (:func:`end_duplex`). An end is
queued on the connection at once, but waits while the connection holds more
than ``write_high`` unwritten, which it does for good once the peer reads
nothing (whether it did when a stall came depended on where the connection's
writer was): before, every stalled duplex of such a peer then waited there
forever, never let go, its budget held. Past ``linger_s`` the peer has read
nothing of the whole connection: it is aborted, and every duplex on it let go.
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
from pipeline.chain.serve.wswrite import SLOW_CLOSE_S
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
        #: how long ending a duplex waits for its connection to take the end (see the module doc)
        self.linger_s = SLOW_CLOSE_S
        #: connections aborted for reading nothing of an end for ``linger_s``
        self.dropped = 0
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
            "sluice_serve_dialogue_dropped_total": self.dropped,
        }

    def count_drop(self) -> None:
        self.dropped += 1


async def serve_duplex(
    resumption: TieredResumption,
    duplex: Duplex,
    *,
    send_buffer: int,
    stall_s: float | None = None,
    budget: Budget | None = None,
    on_redis_error: RedisErrors | None = None,
    linger_s: float = SLOW_CLOSE_S,
    on_drop: Callable[[], None] | None = None,
) -> None:
    """Serve one subscription on an incoming duplex until the peer leaves or falls behind
    (``budget``: what it may queue, shared with the other duplexes of its connection;
    ``on_redis_error``: told each Redis error that ends it; ``linger_s`` and
    ``on_drop``: see :func:`end_duplex`)."""
    parsed = _parse(duplex.initial or b"null")
    if isinstance(parsed, bytes):
        await end_duplex(duplex, parsed, linger_s, on_drop)
        return
    keep = encoding_for(parsed.keep, SEED, parsed.weight)  # the seed shape; weight if asked
    plan = await _plan(resumption, parsed, keep, on_redis_error)
    if isinstance(plan, bytes):
        await end_duplex(duplex, plan, linger_s, on_drop)
        return
    outbox = Outbox(send_buffer, stall_s=stall_s, budget=budget)
    sub = Subscription("0x1", parsed, outbox, envelope=False)
    try:
        ending = await _feed(resumption, duplex, outbox, plan, keep, sub, on_redis_error)
    finally:
        # What it held goes back to its connection's budget, before the end (as a slow
        # websocket's queue is dropped before its 1008).
        outbox.clear()
    if not isinstance(ending, _Gone):
        await end_duplex(duplex, ending, linger_s, on_drop)


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


class _Gone:
    """The duplex or its connection is gone: nothing to end."""


_GONE = _Gone()


async def _feed(
    resumption: TieredResumption,
    duplex: Duplex,
    outbox: Outbox,
    plan: Plan,
    keep: KeyTest | None,
    sub: Subscription,
    on_redis_error: RedisErrors | None = None,
) -> bytes | None | _Gone:
    """Stream the plan into the duplex until the peer leaves, falls behind or resumption
    fails; what to end our half with then (None: no error; :data:`_GONE`: nothing to end)."""

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

    ending: bytes | None | _Gone = None
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
        ending = _GONE
    except* SlowConsumer:
        ending = b"subscriber too slow: send buffer full"
    except* ResumptionError as group_exc:
        first = group_exc.exceptions[0]
        log.warning("dialogue subscription ended: %r", first)
        text = first.public_message if isinstance(first, ResumptionError) else "cannot resume"
        ending = text.encode()[:200]
    except* (aioredis.RedisError, OSError) as group_exc:  # a catch-up's read of the tail
        lost = group_exc.exceptions[0]
        log.warning("dialogue subscription: redis error %r", lost)
        if on_redis_error is not None:
            on_redis_error(lost)
        ending = b"redis unavailable, resubscribe later"
    return ending


async def end_duplex(
    duplex: Duplex,
    error: bytes | None,
    linger_s: float,
    on_drop: Callable[[], None] | None = None,
) -> None:
    """End our half of ``duplex`` (``error``: its error data), waiting at most ``linger_s``
    for its connection to take the end (``on_drop``: told when the connection is dropped).

    The end is queued on the connection at once; what may wait is the connection's
    writing, which stops while the peer reads nothing. Past ``linger_s`` the peer has
    read nothing of the whole connection: it is aborted (every duplex on it let go), as a
    websocket subscriber too slow is dropped when it does not read its 1008. A connection
    already gone is nothing to end.
    """
    try:
        async with asyncio.timeout(linger_s):
            await duplex.end(error=error)
    except TimeoutError:
        host = duplex.host
        if isinstance(host, Connection) and not host.closed:
            log.warning(
                "dialogue peer %s read nothing for %gs after a duplex ended: connection dropped",
                host.name,
                linger_s,
            )
            host.abort(f"peer read nothing for {linger_s:g}s")
            if on_drop is not None:
                on_drop()
    except (DialogueError, ConnectionError) as exc:
        log.info("dialogue subscriber gone: %r", exc)


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
            await end_duplex(duplex, _TOO_MANY, state.linger_s, state.count_drop)
            return
        try:
            await serve_duplex(
                resumption,
                duplex,
                send_buffer=send_buffer,
                stall_s=stall_s,
                budget=budget,
                on_redis_error=state.on_redis_error,
                linger_s=state.linger_s,
                on_drop=state.count_drop,
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
