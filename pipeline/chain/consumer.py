"""The subscriber library: ordered chain updates from a ``sluice serve`` websocket.

``async for update in subscribe(url, from_num, from_hash, prefixes)`` yields
:class:`~pipeline.chain.ordered.Added` and
:class:`~pipeline.chain.ordered.Removed` updates after deduplication,
reordering and reorg handling (:class:`~pipeline.chain.ordered.OrderedChain`).
When the connection drops, or the server closes it (restart, slow
subscriber), it reconnects and resumes from the last complete block by
itself, at most ``max_retries`` times in a row without receiving a block.
A request the server refuses (bad params) raises :class:`BadParams`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp

from pipeline.chain import jsonrpc
from pipeline.chain.batch import parse_batch_result, parse_subbatch_result
from pipeline.chain.ordered import BlockAssembler, ChainUpdate, OrderedChain, OrderingError
from pipeline.errors import BadBatch, BadParams, ChainError

log = logging.getLogger(__name__)

ZERO_HASH = bytes(32)


class SubscriptionLost(ChainError):
    """The server could not be reached again within the retry budget."""

    public_message = "subscription lost"


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
) -> AsyncIterator[ChainUpdate]:
    """Ordered updates from block ``from_num`` on (``from_hash`` None: no block known yet)."""
    chain = OrderedChain(head=None if from_hash is None else (from_num, from_hash), window=window)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    failures = 0
    async with aiohttp.ClientSession() as session:
        while True:
            head = chain.head
            num, block_hash = head if head is not None else (from_num, from_hash or ZERO_HASH)
            got_any = False
            try:
                async with session.ws_connect(
                    url, headers=headers, heartbeat=30, max_msg_size=16 << 20
                ) as ws:
                    sub_id = await _subscribe(ws, num, block_hash, prefixes)
                    chain.expect_rewind()
                    assembler = BlockAssembler()
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        for update in _updates(msg.data, sub_id, assembler, chain):
                            got_any = True
                            yield update
                    log.info("subscription closed by the server: code %s", ws.close_code)
            except (aiohttp.ClientError, ConnectionError, TimeoutError, OrderingError) as exc:
                log.warning("subscription interrupted: %r", exc)
            failures = 0 if got_any else failures + 1
            if failures > max_retries:
                raise SubscriptionLost(f"no block after {max_retries} reconnections to {url}")
            await asyncio.sleep(min(retry_delay_s * (2 ** min(failures, 6)), 5.0))


async def _subscribe(
    ws: aiohttp.ClientWebSocketResponse, num: int, block_hash: bytes, prefixes: Sequence[str]
) -> str:
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "cardinal_subscribe",
        "params": ["streams", hex(num), "0x" + block_hash.hex(), list(prefixes)],
    }
    await ws.send_str(json.dumps(request))
    async with asyncio.timeout(60):
        msg = await ws.receive()
    if msg.type != aiohttp.WSMsgType.TEXT:
        raise ConnectionError(f"no reply to cardinal_subscribe: {msg.type}")
    reply: Any = json.loads(msg.data)
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
