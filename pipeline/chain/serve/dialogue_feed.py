"""The chain feed over a Dialogue duplex on TCP (seed 004, "Other transports").

A client opens a duplex whose initial data is the JSON params of
``cardinal_subscribe`` (``["streams", "0xNUM", "0xHASH", [patterns],
{options}?]``). The server answers on the duplex with one message per result
object (``batch``, ``subbatch`` and the opt-in ``ready``/``reorg``), exactly
the JSON of the websocket notifications' ``result``, produced by the same
:class:`~pipeline.chain.history.resumption.TieredResumption` and bounded the same
way. Bad params end the duplex with a JSON-RPC error object as error data; a
subscriber that falls behind is ended with ``subscriber too slow``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis

from pipeline.blockcodec import KeyTest
from pipeline.chain import jsonrpc
from pipeline.chain.cardinal import SEED, encoding_for
from pipeline.chain.history.resumption import TieredResumption
from pipeline.chain.outbox import Outbox
from pipeline.chain.planning import Plan
from pipeline.chain.serve.subscription import SubscribeParams, Subscription, parse_subscribe
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

_BATCH = 256


async def serve_duplex(
    resumption: TieredResumption,
    duplex: Duplex,
    *,
    send_buffer: int,
    stall_s: float | None = None,
) -> None:
    """Serve one subscription on an incoming duplex until the peer leaves or falls behind."""
    parsed = _parse(duplex.initial or b"null")
    if isinstance(parsed, bytes):
        await duplex.end(error=parsed)
        return
    keep = encoding_for(parsed.keep, SEED, parsed.weight)  # the seed shape; weight if asked
    plan = await _plan(resumption, parsed, keep)
    if isinstance(plan, bytes):
        await duplex.end(error=plan)
        return
    outbox = Outbox(send_buffer, stall_s=stall_s)
    sub = Subscription("0x1", parsed, outbox, envelope=False)
    await _feed(resumption, duplex, outbox, plan, keep, sub)


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
    resumption: TieredResumption, parsed: SubscribeParams, keep: KeyTest | None
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
        error = jsonrpc.error(None, jsonrpc.SERVER_ERROR, "redis unavailable, retry later")
        return error.encode()


async def _feed(
    resumption: TieredResumption,
    duplex: Duplex,
    outbox: Outbox,
    plan: Plan,
    keep: KeyTest | None,
    sub: Subscription,
) -> None:
    """Stream the plan into the duplex until the peer leaves, falls behind or resumption fails."""

    async def write() -> None:
        while True:
            await outbox.wait()
            for text in outbox.pop_many(_BATCH):
                await duplex.send(text)

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


def dialogue_server(
    resumption: TieredResumption,
    host: str,
    port: int,
    *,
    send_buffer: int,
    stall_s: float | None = None,
) -> DialogueServer:
    async def on_duplex(duplex: Duplex) -> None:
        await serve_duplex(resumption, duplex, send_buffer=send_buffer, stall_s=stall_s)

    return DialogueServer(host, port, on_duplex=on_duplex)


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
