"""Bad input and faults: each answered clearly while the server keeps serving everyone else."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct

import aiohttp
import pytest

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.server import CONNECTIONS, HUB, METRICS

from .conftest import STREAM, write_lake

H = "0x" + "00" * 32


async def still_serves(connect, base: str, block_hash: bytes) -> None:
    async with connect(base) as other:
        await other.subscribe(0, block_hash)
        assert [b.num for b in await other.blocks(2)] == [0, 1]


@pytest.mark.parametrize(
    ("frame", "code", "text"),
    [
        ("{not json", -32700, "parse error"),
        ("[]", -32600, "empty batch"),  # (a batch of requests is answered: test_jsonrpc_batch.py)
        ('{"jsonrpc":"2.0","id":1}', -32600, "method"),
        ('{"jsonrpc":"2.0","id":1,"method":"eth_nope","params":[]}', -32601, "eth_nope"),
        ('{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":[]}', -32602, "params"),
        (
            '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":["streams","12",'
            f'"{H}",[]]}}',
            -32602,
            "hex quantity",
        ),
        (
            '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":["streams","0x1",'
            '"0xabc",[]]}',
            -32602,
            "hash",
        ),
        (
            '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":["streams","0x1",'
            f'"{H}",["(("]]}}',
            -32602,
            "does not compile",
        ),
        (
            '{"jsonrpc":"2.0","id":1,"method":"cardinal_subscribe","params":["streams","0x1",'
            f'"{H}",["{"a" * 300}"]]}}',
            -32602,
            "longer than",
        ),
        ('{"jsonrpc":"2.0","id":1,"method":"cardinal_getBlock","params":["zz"]}', -32602, "hex"),
        ('{"jsonrpc":"2.0","id":1,"method":"cardinal_unsubscribe","params":[1]}', -32602, "0xID"),
    ],
)
async def test_bad_requests_get_standard_errors(
    settings, serve, connect, redis_client, frame, code, text
) -> None:
    gen = SyntheticChain(seed=20)
    write_blocks(redis_client, STREAM, gen.take(3))
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.ws.send_str(frame)
        reply = await client.recv()
        assert reply["jsonrpc"] == "2.0"
        assert reply["error"]["code"] == code, reply
        assert text in reply["error"]["message"], reply
        # the connection itself keeps working
        await client.subscribe(0, gen.canonical[0].hash)
        assert len(await client.blocks(3)) == 3


async def test_garbage_binary_and_oversized_frames(settings, serve, connect, redis_client) -> None:
    gen = SyntheticChain(seed=21)
    write_blocks(redis_client, STREAM, gen.take(3))
    async with serve(settings) as (base, _app):
        async with connect(base) as client:
            await client.ws.send_bytes(os.urandom(64))
            reply = await client.recv()
            assert reply["error"]["code"] == -32700 and "binary" in reply["error"]["message"]
            await client.ws.send_str("\x00\xff garbage")
            assert (await client.recv())["error"]["code"] == -32700
        async with connect(base) as client:
            await client.ws.send_str("x" * (128 * 1024))
            msg = await client.ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert client.ws.close_code == 1009
        await still_serves(connect, base, gen.canonical[0].hash)


async def test_unknown_hash_beyond_head_waits_for_live_blocks(
    settings, serve, connect, redis_client
) -> None:
    gen = SyntheticChain(seed=22)
    write_blocks(redis_client, STREAM, gen.take(5))
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(100, b"\x55" * 32, opts={"ready": True})
        ready = await client.recv()
        assert ready["params"]["result"]["type"] == "ready"
        write_blocks(redis_client, STREAM, gen.take(100))  # up to 104
        got = await client.blocks(13)
        assert [b.num for b in got] == list(range(92, 105))  # 100 - threshold 8


async def test_patterns_filter_notifications(settings, serve, connect, redis_client) -> None:
    gen = SyntheticChain(seed=23, prefixes=("s/", "t/"))
    write_blocks(redis_client, STREAM, gen.take(5))
    results: list[dict] = []
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(0, gen.canonical[0].hash, patterns=["t/"])
        got = await client.blocks(5, results=results)
    assert [b.num for b in got] == list(range(5))
    for block in got:
        assert block.updates == {} and block.deletes == ()
        assert list(block.batches) == ["t/"]
        assert all(k.startswith("t/") for k in block.subbatches[0].updates)
    assert {r["type"] for r in results} == {"batch", "subbatch"}
    assert all(r["id"] == "0x" + gen.canonical[0].subbatches[1].id.hex() for r in results[1:2])


async def test_get_block_unsubscribe_and_reorg_notifications(
    settings, serve, connect, redis_client
) -> None:
    gen = SyntheticChain(seed=24)
    blocks = gen.take(12)
    write_lake(settings.lake.uri, blocks[:6])
    write_blocks(redis_client, STREAM, blocks[6:])
    async with serve(settings) as (base, _app), connect(base) as client:
        for num in (2, 9):
            reply = await client.call("cardinal_getBlock", [hex(num)])
            assert reply["result"][0]["hash"] == "0x" + blocks[num].hash.hex()
        assert (await client.call("cardinal_getBlock", ["0x999"]))["result"] is None
        sub = await client.subscribe(10, blocks[10].hash, opts={"reorgs": True, "ready": True})
        results: list[dict] = []
        await client.blocks(2, results=results)
        ready = await client.recv()
        assert ready["params"]["result"] == {
            "type": "ready",
            "num": "0xb",
            "hash": "0x" + blocks[11].hash.hex(),
        }
        # a reorg replacing 10 and 11
        del gen.canonical[10:]
        side = SyntheticChain(seed=77)
        parent = gen.canonical[-1].hash
        new = []
        for num in (10, 11, 12):
            b = side.take(1)[0]
            new.append(type(b)(num=num, hash=b.hash, parent=parent, weight=num + 1))
            parent = new[-1].hash
        write_blocks(redis_client, STREAM, new)
        results.clear()
        got = await client.blocks(3, results=results)
        assert got == new
        assert results[0] == {"type": "reorg", "num": "0xa", "depth": "0x2"}
        assert (await client.call("cardinal_unsubscribe", [sub]))["result"] is True
        assert (await client.call("cardinal_unsubscribe", [sub]))["result"] is False


async def test_token_auth_health_and_metrics(settings, serve, connect, redis_client) -> None:
    gen = SyntheticChain(seed=25)
    write_blocks(redis_client, STREAM, gen.take(3))
    async with serve(settings.replace(serve_token="s3cret")) as (base, _app):
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                await session.ws_connect(base + "/ws")
            assert err.value.status == 401
            with pytest.raises(aiohttp.WSServerHandshakeError):
                await session.ws_connect(base + "/ws", headers={"Authorization": "Bearer wrong"})
        async with connect(base, headers={"Authorization": "Bearer s3cret"}) as client:
            await client.subscribe(0, gen.canonical[0].hash)
            assert len(await client.blocks(3)) == 3
        async with connect(base, params={"token": "s3cret"}) as client:
            await client.subscribe(0, gen.canonical[0].hash)
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/healthz") as resp:
                health = await resp.json()
                assert resp.status == 200 and health["redis"] == "up"
            async with session.get(base + "/metrics") as resp:
                assert resp.status == 401  # with a token set, /metrics needs it too
            bearer = {"Authorization": "Bearer s3cret"}
            async with session.get(base + "/metrics", headers=bearer) as resp:
                text = await resp.text()
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE sluice_serve_connections_total counter" in text
    assert "sluice_serve_auth_failures_total 3" in text
    assert "sluice_serve_connections_total 2" in text


def _client_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    length = len(payload)
    header = (
        struct.pack("!BB", 0x81, 0x80 | length)
        if length < 126
        else struct.pack("!BBH", 0x81, 0x80 | 126, length)
    )
    return header + mask + masked


async def test_client_that_never_reads_is_disconnected_with_a_reason(
    settings, serve, connect, redis_client
) -> None:
    gen = SyntheticChain(seed=26, value_size=4096, updates_per_block=8)
    write_blocks(redis_client, STREAM, gen.take(2))
    async with serve(settings.replace(serve_send_buffer=64)) as (base, app):
        port = int(base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        await reader.readuntil(b"\r\n\r\n")
        request = {"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe",
                   "params": ["streams", "0x0", "0x" + gen.canonical[0].hash.hex(), []]}  # fmt: skip
        writer.write(_client_frame(json.dumps(request)))
        await writer.drain()
        async with connect(base) as good:
            await good.subscribe(0, gen.canonical[0].hash)
            await good.blocks(2)
            for _ in range(30):
                write_blocks(redis_client, STREAM, gen.take(10))
                got = await good.blocks(10)
                assert got[-1] == gen.canonical[-1]  # the good subscriber keeps up
                if "slow_disconnects_total 1" in app[METRICS].render():
                    break
            metrics = app[METRICS].render()
            assert "sluice_serve_slow_disconnects_total 1" in metrics
        # the slow client finally reads: all it was sent, then a close frame with the reason
        data = b""
        try:
            while chunk := await asyncio.wait_for(reader.read(1 << 20), 3):
                data += chunk
        except TimeoutError:
            raise AssertionError(f"the server never closed; {len(data)} bytes read") from None
        writer.close()
    assert b"subscriber too slow" in data
    close_at = data.rfind(b"\x88")
    assert close_at >= 0 and struct.unpack("!H", data[close_at + 2 : close_at + 4])[0] == 1008


async def test_a_thousand_connections_open_and_close(
    settings, serve, connect, redis_client
) -> None:
    gen = SyntheticChain(seed=27)
    write_blocks(redis_client, STREAM, gen.take(3))
    async with serve(settings) as (base, app):
        sem = asyncio.Semaphore(100)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(i: int) -> None:
                async with sem, session.ws_connect(base + "/ws") as ws:
                    if i % 4 == 0:
                        await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe",
                                                      "params": ["streams", "0x0", "0x" + gen.canonical[0].hash.hex(), []]}))  # fmt: skip
                        reply = json.loads((await ws.receive(timeout=20)).data)
                        assert reply["result"] == "0x1"

            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(1000))), 120)
        for _ in range(100):
            if not app[CONNECTIONS] and len(app[HUB]) == 0:
                break
            await asyncio.sleep(0.05)
        assert len(app[CONNECTIONS]) == 0 and len(app[HUB]) == 0
        assert "sluice_serve_connections_total 1000" in app[METRICS].render()
        await still_serves(connect, base, gen.canonical[0].hash)


async def test_redis_restart_under_a_live_subscription(
    settings, serve, connect, redis_factory
) -> None:
    import redis as redis_sync

    server = redis_factory(aof=True)
    client = redis_sync.Redis.from_url(server.url)
    gen = SyntheticChain(seed=28)
    write_blocks(client, STREAM, gen.take(5))
    async with serve(settings.replace(redis_url=server.url)) as (base, _app), connect(base) as sub:
        await sub.subscribe(0, gen.canonical[0].hash)
        got = await sub.blocks(5)
        await asyncio.to_thread(server.restart)
        client = redis_sync.Redis.from_url(server.url)
        write_blocks(client, STREAM, gen.take(10))
        got += await sub.blocks(10, wait_s=30)
    client.close()
    assert got == gen.canonical[:15]
