"""JSON-RPC batch arrays on a real ``sluice serve``, at ``/ws`` and at ``/cardinal``.

A batch is answered with one text frame, the array of its replies in request
order (notifications get none), as cardinal-rpc's websocket transport answers
it; each element is bounded and admitted like the same request alone; a
subscription opened in a batch starts after the batch's reply. The last test
sends the same batches to cardinal-rpc itself (the library producer of
tests/go) and checks where Sluice follows it and where it keeps JSON-RPC 2.0.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from pipeline.chain.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_BATCH,
    MAX_DEPTH,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    SERVER_ERROR,
)
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.wsconn import MAX_SUBSCRIPTIONS

from .conftest import STREAM, Client

PATHS = ["/ws", "/cardinal"]


def _req(req_id: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}


async def _frame(ws: aiohttp.ClientWebSocketResponse) -> Any:
    msg = await ws.receive(timeout=10)
    assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data, msg.extra)
    return json.loads(msg.data)


async def _ask(ws: aiohttp.ClientWebSocketResponse, frame: Any) -> Any:
    await ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))
    return await _frame(ws)


def _code(reply: dict[str, Any]) -> int | None:
    return reply["error"]["code"] if "error" in reply else None


@pytest.mark.parametrize("path", PATHS)
async def test_a_batch_is_answered_with_one_array_then_its_subscription(
    path: str, settings, serve, redis_client
) -> None:
    blocks = SyntheticChain(seed=80).take(3)
    write_blocks(redis_client, STREAM, blocks)
    h0 = "0x" + blocks[0].hash.hex()
    batch = [
        _req(1, "eth_blockNumber", []),
        _req("two", "cardinal_streamsBlock", ["0x1"]),
        {"jsonrpc": "2.0", "method": "rpc_methods", "params": []},  # a notification: no entry
        5,
        _req(4, "rpc_modules", []),
        _req(5, "cardinal_subscribe", ["streams", "0x0", h0, []]),
        _req(6, "cardinal_getBlock", ["0x2"]),
        _req(7, "cardinal_getBlock", ["0x1", "0x2"]),
        {"jsonrpc": "1.0", "id": 8, "method": "rpc_modules"},
    ]
    async with serve(settings) as (base, _app), aiohttp.ClientSession() as session:
        async with session.ws_connect(base + path) as ws:  # the same calls, one at a time
            alone = {i: await _ask(ws, batch[i]) for i in (1, 4, 6)}
        async with session.ws_connect(base + path) as ws:
            reply = await _ask(ws, batch)  # the first frame: the array, before any notification
            assert isinstance(reply, list), reply
            assert [r["id"] for r in reply] == [1, "two", None, 4, 5, 6, 7, 8]
            assert [_code(r) for r in reply] == [
                METHOD_NOT_FOUND, None, INVALID_REQUEST, None, None, None, INVALID_PARAMS,
                INVALID_REQUEST,
            ]  # fmt: skip
            assert reply[1] == alone[1] and reply[3] == alone[4]
            assert reply[5] == alone[6] and reply[5]["result"]
            sub = reply[4]["result"]
            assert isinstance(sub, str) and sub.startswith("0x")
            if path == "/ws":
                got = await Client(session, ws).blocks(3, subscription=sub)
                assert [b.hash for b in got] == [b.hash for b in blocks]
            else:
                results: list[dict[str, Any]] = []
                while not results or results[-1]["type"] != "ready":
                    note = await _frame(ws)
                    assert note["method"] == "cardinal_subscribe", note
                    assert note["params"]["subscription"] == sub
                    results.append(note["params"]["result"])
                numbers = [r["batch"]["number"] for r in results if r["type"] == "batch"]
                assert numbers == ["0x0", "0x1", "0x2"]


@pytest.mark.parametrize("path", PATHS)
async def test_batches_are_bounded_like_their_elements(
    path: str, settings, serve, redis_client
) -> None:
    blocks = SyntheticChain(seed=81).take(2)
    write_blocks(redis_client, STREAM, blocks)
    h0 = "0x" + blocks[0].hash.hex()
    modules = [_req(i, "rpc_modules", []) for i in range(1000)]
    deep = json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)  # as params: one level too deep
    async with (
        serve(settings) as (base, _app),
        aiohttp.ClientSession() as session,
        session.ws_connect(base + path) as ws,
    ):
        empty = await _ask(ws, "[]")
        assert _code(empty) == INVALID_REQUEST and empty["id"] is None  # one object
        thousand = json.dumps(modules, separators=(",", ":"))
        assert len(thousand) < 64 * 1024  # under the frame limit: refused for its length
        refused = await _ask(ws, thousand)
        assert _code(refused) == INVALID_REQUEST
        assert refused["error"]["message"] == f"batch of 1000 requests: at most {MAX_BATCH}"
        bomb = await _ask(ws, f"[{json.dumps(modules[0])},{json.dumps(_req(2, 'm', deep))}]")
        assert _code(bomb) == PARSE_ERROR and "batch element" in bomb["error"]["message"]
        most = await _ask(ws, modules[:MAX_BATCH])
        assert [r["id"] for r in most] == list(range(MAX_BATCH))
        assert all(r["result"] == {"cardinal": "1.0", "rpc": "1.0"} for r in most)
        # only notifications: no reply at all, so the next frame answers the next call
        await ws.send_str(json.dumps([{k: v for k, v in modules[0].items() if k != "id"}] * 3))
        assert (await _ask(ws, _req(9, "rpc_modules", [])))["id"] == 9
        subscribes = [
            _req(i, "cardinal_subscribe", ["streams", "0x0", h0, []])
            for i in range(MAX_SUBSCRIPTIONS + 1)
        ]
        answered = await _ask(ws, subscribes)  # the subscription bound holds inside a batch
        assert [r["id"] for r in answered] == list(range(MAX_SUBSCRIPTIONS + 1))
        ids = {r["result"] for r in answered if "result" in r}
        errors = [r["error"] for r in answered if "error" in r]
        assert len(ids) == MAX_SUBSCRIPTIONS and len(errors) == 1
        assert errors[0] == {
            "code": INVALID_PARAMS,
            "message": f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection",
        }


async def test_a_batch_counts_against_the_in_flight_bounds(
    settings, serve, redis_client, monkeypatch
) -> None:
    from pipeline.chain.serve import wsconn

    write_blocks(redis_client, STREAM, SyntheticChain(seed=82).take(3))
    calls = [_req(i, "cardinal_getBlock", [hex(i % 3)]) for i in range(10)]
    async with (
        serve(settings) as (base, app),
        aiohttp.ClientSession() as session,
        session.ws_connect(base + "/ws") as ws,
    ):
        # One connection's bound: the first 4 run, the other 6 are refused in their places.
        monkeypatch.setattr(wsconn, "MAX_IN_FLIGHT", 4)
        reply = await _ask(ws, calls)
        assert [r["id"] for r in reply] == list(range(10))
        assert [r["result"][0]["num"] for r in reply[:4]] == ["0x0", "0x1", "0x2", "0x0"]
        message = "too many requests in flight (at most 4): wait for replies"
        assert all(r["error"] == {"code": SERVER_ERROR, "message": message} for r in reply[4:])
        assert "sluice_serve_requests_refused_total 6" in app[wsconn.METRICS].render()
        again = await _ask(ws, calls[:4])  # the slots came back with the batch's reply
        assert all("result" in r for r in again)
        # The whole server's bound, the same way.
        monkeypatch.setattr(wsconn, "MAX_IN_FLIGHT", 64)
        monkeypatch.setattr(wsconn, "MAX_IN_FLIGHT_SERVER", 3)
        reply = await _ask(ws, calls[:5])
        assert [_code(r) for r in reply] == [None, None, None, SERVER_ERROR, SERVER_ERROR]
        assert reply[4]["error"]["message"] == "server busy: retry later"
        assert (await _ask(ws, _req(99, "rpc_modules", [])))["id"] == 99
        assert len(app[wsconn.CALLS]) == 0


async def _answers(url: str, frames: list[Any]) -> list[Any]:
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        return [await _ask(ws, frame) for frame in frames]


async def test_batches_answer_as_cardinal_rpc_does(settings, serve, redis_client, go_run) -> None:
    """The library producer of tests/go is cardinal-rpc's websocket transport: same batch, same
    array; Sluice departs only where cardinal-rpc departs from JSON-RPC 2.0."""
    from pipeline.runtime.ports import free_port
    from tests.integration.chain.test_cardinal_go import _listening

    write_blocks(redis_client, STREAM, SyntheticChain(seed=83).take(3))
    batch = [
        _req(1, "rpc_modules", []),
        _req(2, "cardinal_streamsBlock", ["0x99"]),
        _req("3", "cardinal_unsubscribe", ["0x9"]),
        _req(4, "eth_blockNumber", []),
    ]
    note = {"jsonrpc": "2.0", "method": "rpc_modules", "params": []}
    frames = [batch, "[]", [note, _req(5, "rpc_modules", [])]]
    port = free_port()
    async with go_run("producer", "-port", str(port)), serve(settings) as (base, _app):
        await _listening(port)
        library = await _answers(f"ws://127.0.0.1:{port}", frames)
        sluice = await _answers(base.replace("http://", "ws://") + "/cardinal", frames)

    def shape(replies: list[dict[str, Any]]) -> list[Any]:
        return [(r["id"], r.get("result"), _code(r)) for r in replies]

    assert (
        shape(library[0])
        == shape(sluice[0])
        == [
            (1, {"cardinal": "1.0", "rpc": "1.0"}, None),
            (2, None, -1),
            ("3", None, -32000),
            (4, None, METHOD_NOT_FOUND),
        ]
    )
    assert [r["error"]["message"] for r in library[0][1:3]] == [
        r["error"]["message"] for r in sluice[0][1:3]
    ]
    # Where cardinal-rpc departs from JSON-RPC 2.0 and Sluice does not:
    assert library[1] == [] and _code(sluice[1]) == INVALID_REQUEST  # an empty batch
    assert [r["id"] for r in library[2]] == [None, 5]  # it answers a notification
    assert [r["id"] for r in sluice[2]] == [5]
