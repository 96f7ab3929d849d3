"""The subscriber library: ordered chain updates from a ``sluice serve`` websocket.

``async for update in subscribe(url, from_num, from_hash, prefixes)`` yields
:class:`~pipeline.chain.client.ordered.Added` and
:class:`~pipeline.chain.client.ordered.Removed` updates after deduplication,
reordering and reorg handling (:class:`~pipeline.chain.client.ordered.OrderedChain`).
When the connection drops, or the server closes it (restart, slow
subscriber), it reconnects and resumes from the last complete block by
itself, at most ``max_retries`` times in a row without receiving a block.
A request the server refuses (bad params) raises :class:`BadParams`.

``dialect="cardinal"`` speaks the shape of github.com/openrelayxyz/cardinal-streams
(:mod:`pipeline.chain.cardinal`): against ``sluice serve``'s ``/cardinal``
endpoint, or against the library's own websocket producer
(``transports.NewWebsocketProducer``). It subscribes with the library's
3-parameter call (patterns, when given, follow as a 4th), follows ``reorg``
results (the named ancestor becomes the head) and waits for nothing else:
``ready`` needs no action. Blocks without a weight count as ``num + 1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import aiohttp

from pipeline.blockcodec import parse_batch_result, parse_subbatch_result
from pipeline.chain import jsonrpc
from pipeline.chain.cardinal import (
    CARDINAL,
    DIALECTS,
    SEED,
    parse_cardinal_batch,
    parse_cardinal_reorg,
    parse_cardinal_subbatch,
)
from pipeline.chain.client.ordered import BlockAssembler, ChainUpdate, OrderedChain
from pipeline.errors import BadBatch, BadParams, ChainGap, OrderingError, SubscriptionLost
from pipeline.loggate import LogGate

log = logging.getLogger(__name__)

ZERO_HASH = bytes(32)
#: Notifications kept while waiting for the reply to the subscribe call.
MAX_EARLY = 10_000
#: A subscription failing again and again logs one line per this many seconds.
WARN_EVERY_S = 10.0


async def subscribe(
    url: str,
    from_num: int = 0,
    from_hash: bytes | None = None,
    prefixes: Sequence[str] = (),
    *,
    token: str | None = None,
    max_retries: int = 20,
    retry_delay_s: float = 0.2,
    window: int = 4096,
    dialect: str = SEED,
) -> AsyncIterator[ChainUpdate]:
    """Ordered updates from block ``from_num`` on (``from_hash`` None: no block known yet)."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}")
    chain = OrderedChain(
        head=None if from_hash is None else (from_num, from_hash), window=window, gaps=True
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    failures = 0
    #: a subscriber retrying a server that is down would log a long repr per attempt
    gate = LogGate(log, WARN_EVERY_S)
    async with aiohttp.ClientSession() as session:
        while True:
            head = chain.head
            num, block_hash = head if head is not None else (from_num, from_hash or ZERO_HASH)
            got_any = False
            try:
                connection = _connection(
                    session, url, headers, (num, block_hash), prefixes, dialect, chain, gate
                )
                async with contextlib.aclosing(connection) as updates:
                    async for update in updates:
                        got_any = True
                        yield update
            except ChainGap as exc:
                # The producer skipped blocks (the library's producer does while a
                # subscriber catches up): resume from the head at once, no backoff.
                log.info("resubscribing from the head: %s", exc)
                if got_any:
                    failures = 0
                    continue
            except (aiohttp.ClientError, ConnectionError, TimeoutError, OrderingError) as exc:
                gate.failed(
                    url, "subscription to %s interrupted: %s; retrying", url, _short(exc)
                )  # fmt: skip
            failures = 0 if got_any else failures + 1
            if failures > max_retries:
                raise SubscriptionLost(f"no block after {max_retries} reconnections to {url}")
            await asyncio.sleep(min(retry_delay_s * (2 ** min(failures, 6)), 5.0))


async def _connection(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    start: tuple[int, bytes],
    prefixes: Sequence[str],
    dialect: str,
    chain: OrderedChain,
    gate: LogGate,
) -> AsyncGenerator[ChainUpdate]:
    """The updates of one websocket connection, subscribed at ``start`` (num, hash), until
    the server closes it: first those of notifications sent before the subscribe reply."""
    async with session.ws_connect(url, headers=headers, heartbeat=30, max_msg_size=16 << 20) as ws:
        early: list[str] = []
        sub_id = await _subscribe(ws, *start, prefixes, dialect, early)
        gate.ended(url, "subscription to %s resumed", url)
        chain.expect_rewind()
        assembler = BlockAssembler()
        updates = _cardinal_updates if dialect == CARDINAL else _updates
        for text in early:
            for update in updates(text, sub_id, assembler, chain):
                yield update
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            for update in updates(msg.data, sub_id, assembler, chain):
                yield update
        log.info("subscription closed by the server: code %s", ws.close_code)


def _short(exc: BaseException) -> str:
    """What went wrong in a few words (an aiohttp repr runs to 200 characters)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


async def _subscribe(
    ws: aiohttp.ClientWebSocketResponse,
    num: int,
    block_hash: bytes,
    prefixes: Sequence[str],
    dialect: str = SEED,
    early: list[str] | None = None,
) -> str:
    """Send the subscribe call and return the subscription id.

    Notifications that arrive before the reply (the library's producer may
    send its first ones first) are appended to ``early``, at most
    :data:`MAX_EARLY`, to be handled once the id is known.
    """
    params: list[Any] = ["streams", hex(num), "0x" + block_hash.hex()]
    if dialect == SEED:
        # Weights drive the fork choice (a shorter, heavier chain must win): ask for them;
        # and for a notice before a reorg's first block, which may lie below what the
        # chain remembers (a deep reorg), where an unannounced block is a stale duplicate.
        params += [list(prefixes), {"weight": True, "reorgs": True}]
    elif prefixes:
        params.append(list(prefixes))
    request = {"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe", "params": params}
    await ws.send_str(json.dumps(request))
    async with asyncio.timeout(60):
        while True:
            msg = await ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"no reply to cardinal_subscribe: {msg.type}")
            reply: Any = json.loads(msg.data)
            if isinstance(reply, dict) and "id" in reply:
                break
            if early is None or len(early) >= MAX_EARLY:
                raise ConnectionError("too many notifications before the subscription reply")
            early.append(msg.data)
    if "error" in reply:
        error = reply["error"]
        if error.get("code") == jsonrpc.INVALID_PARAMS:
            raise BadParams(error.get("message", "invalid params"))
        raise ConnectionError(f"subscription refused: {error}")
    return str(reply["result"])


def _updates(
    text: str, sub_id: str, assembler: BlockAssembler, chain: OrderedChain
) -> list[ChainUpdate]:
    parsed = jsonrpc.parse_notification(text)
    if parsed is None or parsed[0] != sub_id or not isinstance(parsed[1], dict):
        return []
    result = parsed[1]
    if result.get("type") == "reorg":
        chain.expect_rewind()  # the next block replaces everything from its height up
        return []
    try:
        if result.get("type") == "batch":
            block = assembler.batch(parse_batch_result(result))
        elif result.get("type") == "subbatch":
            block = assembler.subbatch(*parse_subbatch_result(result))
        else:
            return []
    except BadBatch as exc:
        log.warning("dropping a malformed notification: %s", exc)
        return []
    return [] if block is None else chain.accept(block)


def _cardinal_updates(
    text: str, sub_id: str, assembler: BlockAssembler, chain: OrderedChain
) -> list[ChainUpdate]:
    parsed = jsonrpc.parse_notification(text)
    if parsed is None or parsed[0] != sub_id or not isinstance(parsed[1], dict):
        return []
    result = parsed[1]
    kind = result.get("type")
    try:
        if kind == "batch":
            block = assembler.batch(parse_cardinal_batch(result))
        elif kind == "subbatch":
            block = assembler.subbatch(*parse_cardinal_subbatch(result))
        elif kind == "reorg":
            return chain.reorg_to(*parse_cardinal_reorg(result))
        else:
            return []  # "ready" and anything newer
    except BadBatch as exc:
        log.warning("dropping a malformed notification: %s", exc)
        return []
    return [] if block is None else chain.accept(block)
