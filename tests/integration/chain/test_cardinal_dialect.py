"""The cardinal dialect on ``sluice serve``: chosen by URL, same refusals, same resumption.

Bad input is refused on ``/cardinal`` exactly as on ``/ws`` (the same replies,
the same close codes); the seed dialect's notifications are unchanged unless
the subscriber opts in to weights; ``cardinal_streamsBlock`` answers as the
library's server does.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from pipeline.blockcodec import block_results
from pipeline.chain.produce.generator import SyntheticChain, write_blocks

from .conftest import STREAM

H = "0x" + "ab" * 32

BAD_REQUESTS = [
    "not json",
    "[]",
    '{"jsonrpc":"2.0","id":1}',
    '{"jsonrpc":"1.0","id":1,"method":"cardinal_subscribe","params":[]}',
    '{"jsonrpc":"2.0","id":1,"method":"nope","params":[]}',
    '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":["streams"]}',
    '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":["streams","0xZZ","'
    + H
    + '"]}',
    '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":["streams","0x1","0x12"]}',
    '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe",'
    '"params":["streams","0x1","' + H + '",["(("]]}',
    '{"jsonrpc":"2.0","id":1,"method":"cardinal_getBlock","params":["0x1","0x2"]}',
    '{"jsonrpc":"2.0","id":"x","method":"cardinal_unsubscribe","params":[5]}',
    "[" * 5000 + "]" * 5000,
]


async def _replies(base: str, path: str) -> list[Any]:
    out: list[Any] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(base + path) as ws:
        for text in BAD_REQUESTS:
            await ws.send_str(text)
            out.append(json.loads((await ws.receive(timeout=10)).data))
        await ws.send_bytes(b"\x00\x01")
        out.append(json.loads((await ws.receive(timeout=10)).data))
        await ws.send_str("x" * (128 * 1024))  # over the frame limit
        msg = await ws.receive(timeout=10)
        out.append((msg.type, ws.close_code))
    return out


async def test_bad_input_is_refused_the_same_way(settings, serve, redis_client) -> None:
    write_blocks(redis_client, STREAM, SyntheticChain(seed=70).take(3))
    async with serve(settings) as (base, _app):
        seed = await _replies(base, "/ws")
        assert await _replies(base, "/cardinal") == seed
        assert await _replies(base, "/ws?dialect=cardinal") == seed
        assert seed[-1] == (aiohttp.WSMsgType.CLOSE, aiohttp.WSCloseCode.MESSAGE_TOO_BIG)
        assert all("error" in r for r in seed[:-1])
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                await session.ws_connect(base + "/ws?dialect=klingon")
            assert err.value.status == 400


async def _first_results(ws: aiohttp.ClientWebSocketResponse, params: list[Any], n: int) -> list:
    await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "cardinal_subscribe",
                                  "params": params}))  # fmt: skip
    reply = json.loads((await ws.receive(timeout=10)).data)
    assert reply["id"] == 7 and reply["result"] == "0x1", reply
    out = []
    for _ in range(n):
        note = json.loads((await ws.receive(timeout=10)).data)
        assert note["method"] == "cardinal_subscribe" and note["params"]["subscription"] == "0x1"
        out.append(note["params"]["result"])
    return out


async def test_shapes_per_dialect_and_streams_block(settings, serve, redis_client) -> None:
    gen = SyntheticChain(seed=71, prefixes=("s/",))
    blocks = gen.take(4)
    write_blocks(redis_client, STREAM, blocks)
    async with serve(settings) as (base, _app), aiohttp.ClientSession() as session:
        h0 = "0x" + blocks[0].hash.hex()
        async with session.ws_connect(base + "/ws") as ws:
            got = await _first_results(ws, ["streams", "0x0", h0, []], 2)
            assert got == [json.loads(t) for t in block_results(blocks[0])]  # the seed, unchanged
        async with session.ws_connect(base + "/ws") as ws:
            got = await _first_results(ws, ["streams", "0x0", h0, [], {"weight": True}], 1)
            assert got[0]["weight"] == hex(blocks[0].weight or 0)
        async with session.ws_connect(base + "/cardinal") as ws:
            got = await _first_results(ws, ["streams", "0x0", h0], 9)  # the library's 3 params
            assert [r["type"] for r in got] == ["batch", "subbatch"] * 4 + ["ready"]
            first = got[0]["batch"]
            assert (first["number"], first["weight"], first["hash"]) == ("0x0", "0x1", h0)
            assert got[1]["subbatch"]["batchid"] == "0x" + blocks[0].subbatches[0].id.hex()
            call = {"jsonrpc": "2.0", "id": 8, "method": "cardinal_streamsBlock", "params": ["0x2"]}
            await ws.send_str(json.dumps(call))
            reply = json.loads((await ws.receive(timeout=10)).data)
            batch = reply["result"]["batch"]
            b2 = blocks[2]
            values = {k: "0x" + v.hex() for k, v in b2.updates.items()}
            values.update({k: "0x" + v.hex() for k, v in b2.subbatches[0].updates.items()})
            assert (batch["hash"], batch["values"], batch["batches"]) == (
                "0x" + b2.hash.hex(), values, {},
            )  # fmt: skip
            call["params"] = ["0x99"]
            await ws.send_str(json.dumps(call))
            reply = json.loads((await ws.receive(timeout=10)).data)
            assert reply["error"]["message"] == "block not found"


PARITY_CALLS = [
    {"method": "rpc_modules", "params": []},
    {"method": "cardinal_streamsBlock", "params": ["0x99"]},
    {"method": "cardinal_unsubscribe", "params": ["0x9"]},
]


async def _answers(url: str) -> list[Any]:
    """What a server answers to PARITY_CALLS: each result, or each error's (code, message)."""
    out: list[Any] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        for i, call in enumerate(PARITY_CALLS):
            await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": i + 1, **call}))
            reply = json.loads((await ws.receive(timeout=10)).data)
            assert reply["id"] == i + 1, reply
            error = reply.get("error")
            out.append(reply["result"] if error is None else (error["code"], error["message"]))
    return out


async def test_json_rpc_answers_as_the_library_producer_does(
    settings, serve, redis_client, go_run
) -> None:
    from pipeline.runtime.ports import free_port
    from tests.integration.chain.test_cardinal_go import _listening

    write_blocks(redis_client, STREAM, SyntheticChain(seed=74).take(3))
    port = free_port()
    async with go_run("producer", "-port", str(port)), serve(settings) as (base, _app):
        await _listening(port)
        library = await _answers(f"ws://127.0.0.1:{port}")
        assert library == [
            {"cardinal": "1.0", "rpc": "1.0"},
            (-1, "block not found"),
            (-32000, "subscription not found"),
        ]
        assert await _answers(base.replace("http://", "ws://") + "/cardinal") == library
        seed = await _answers(base.replace("http://", "ws://") + "/ws")
        assert seed[2] is False  # the seed dialect keeps its answer to an unknown id
