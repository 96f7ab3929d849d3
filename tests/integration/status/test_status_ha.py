"""The status board on a Redis Cluster: streams in different slots, each read on its own."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer
from redis.crc import key_slot

from pipeline import keys
from pipeline.chain.serve.server import create_app
from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role
from tests.support.poll import until

from .test_status_json import STREAM, _add_blocks, _get, _settings

OTHER = "chain:other"


async def test_status_board_follows_streams_in_different_slots(
    cluster_url: str, tmp_path: Path
) -> None:
    assert key_slot(keys.stream(STREAM).encode()) != key_slot(keys.stream(OTHER).encode())
    client = redisconn.connect_sync(cluster_url, Role.CLI)
    try:
        _add_blocks(client, STREAM, range(12))
        _add_blocks(client, OTHER, range(5))
        server = TestServer(create_app(_settings(cluster_url, str(tmp_path / "lake"))))
        await server.start_server()
        try:
            url = f"http://127.0.0.1:{server.port}/status.json"
            async with aiohttp.ClientSession() as session:

                async def heads() -> list[object]:
                    data = await _get(session, url)
                    return [(s["head"] or {}).get("num") for s in data["streams"]]

                await until(heads, accept=lambda h: h == [11, 4], within_s=30)
                _add_blocks(client, OTHER, range(5, 9))  # live: read after the first pass
                await until(heads, accept=lambda h: h == [11, 8], within_s=30)
                data = await _get(session, url)
                assert [s["redis"]["length"] for s in data["streams"]] == [12, 9]
        finally:
            await server.close()
    finally:
        client.close()
