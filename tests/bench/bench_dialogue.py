"""Dialogue over loopback TCP, one connection, against raw asyncio streams with a 4-byte length prefix.

Figures (each the best of ``ROUNDS`` runs, value and baseline interleaved in the same process):
- messages_per_s: 256 B messages one way.
- requests_per_s: request/response, 64 in flight (sync handler answering inline, as the baseline does).
- duplex_mb_per_s: one duplex streaming 64 KiB chunks one way.
Extras: requests with an async handler, and the duplex with the flow-control window negotiated.
"""

from __future__ import annotations

import asyncio
import struct
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import contextlib

from common import Report  # noqa: E402

from pipeline.dialogue.connection import Connection  # noqa: E402
from pipeline.dialogue.duplex import Duplex  # noqa: E402
from pipeline.dialogue.protocol import Role  # noqa: E402

ROUNDS = 3
MESSAGES = 200_000
MESSAGE_SIZE = 256
REQUESTS = 50_000
IN_FLIGHT = 64
CHUNK = 64 * 1024
DUPLEX_BYTES = 256 * 1024 * 1024
LEN = struct.Struct(">I")
DRAIN_ABOVE = 1 << 16


async def serve(handler: Callable[..., Awaitable[None]]) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


# ------------------------------------------------------------------ baselines


async def raw_write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(LEN.pack(len(data)) + data)
    if writer.transport.get_write_buffer_size() > DRAIN_ABOVE:
        await writer.drain()


async def raw_read(reader: asyncio.StreamReader) -> bytes:
    (size,) = LEN.unpack(await reader.readexactly(4))
    return await reader.readexactly(size)


async def raw_messages() -> float:
    done = asyncio.Event()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(MESSAGES):
            await raw_read(reader)
        done.set()
        writer.close()

    server, port = await serve(sink)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = b"m" * MESSAGE_SIZE
    start = time.perf_counter()
    for _ in range(MESSAGES):
        await raw_write(writer, data)
    await done.wait()
    elapsed = time.perf_counter() - start
    writer.close()
    server.close()
    await server.wait_closed()
    return MESSAGES / elapsed


async def raw_requests() -> float:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await raw_write(writer, await raw_read(reader))
        except asyncio.IncompleteReadError:
            writer.close()

    server, port = await serve(echo)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    pending: deque[asyncio.Future[bytes]] = deque()
    loop = asyncio.get_running_loop()

    async def responses() -> None:
        while True:
            data = await raw_read(reader)
            pending.popleft().set_result(data)

    reading = asyncio.create_task(responses())
    per_worker = REQUESTS // IN_FLIGHT

    async def worker() -> None:
        for _ in range(per_worker):
            fut: asyncio.Future[bytes] = loop.create_future()
            pending.append(fut)
            await raw_write(writer, b"r" * 64)
            await fut

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    elapsed = time.perf_counter() - start
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    writer.close()
    server.close()
    await server.wait_closed()
    return per_worker * IN_FLIGHT / elapsed


async def raw_duplex() -> float:
    done = asyncio.Event()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        total = 0
        while total < DUPLEX_BYTES:
            total += len(await raw_read(reader))
        done.set()
        writer.close()

    server, port = await serve(sink)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = b"d" * CHUNK
    start = time.perf_counter()
    for _ in range(DUPLEX_BYTES // CHUNK):
        await raw_write(writer, chunk)
    await done.wait()
    elapsed = time.perf_counter() - start
    writer.close()
    server.close()
    await server.wait_closed()
    return DUPLEX_BYTES / elapsed / 1e6


# ------------------------------------------------------------------- dialogue


async def dialogue_pair(
    **server_options: Any,
) -> tuple[asyncio.Server, Connection, list[Connection]]:
    accepted: list[Connection] = []
    closed = asyncio.Event()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection.over_streams(reader, writer, Role.SERVER, **server_options)
        accepted.append(conn)
        async with conn:
            await conn.wait_closed()
        closed.set()

    server, port = await serve(accept)
    client_options = {"window": server_options["window"]} if "window" in server_options else {}
    client = await Connection.connect("127.0.0.1", port, **client_options)
    return server, client, accepted


async def finish(server: asyncio.Server, client: Connection) -> None:
    await client.close()
    server.close()
    await server.wait_closed()


async def dialogue_messages() -> float:
    count = 0
    done = asyncio.Event()

    def on_message(data: bytes) -> None:
        nonlocal count
        count += 1
        if count == MESSAGES:
            done.set()

    server, client, _ = await dialogue_pair(on_message=on_message)
    data = b"m" * MESSAGE_SIZE
    start = time.perf_counter()
    for _ in range(MESSAGES):
        await client.send_message(data)
    await done.wait()
    elapsed = time.perf_counter() - start
    await finish(server, client)
    return MESSAGES / elapsed


async def dialogue_requests(async_handler: bool = False) -> float:
    async def answer_async(data: bytes) -> bytes:
        return data

    def answer(data: bytes) -> bytes:
        return data

    server, client, _ = await dialogue_pair(on_request=answer_async if async_handler else answer)
    per_worker = REQUESTS // IN_FLIGHT

    async def worker() -> None:
        for _ in range(per_worker):
            await client.request(b"r" * 64)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    elapsed = time.perf_counter() - start
    await finish(server, client)
    return per_worker * IN_FLIGHT / elapsed


async def dialogue_duplex(window: int | None = None) -> float:
    done = asyncio.Event()

    async def sink(d: Duplex) -> None:
        total = 0
        async for data in d:
            total += len(data)
        assert total == DUPLEX_BYTES, total
        done.set()

    options: dict[str, Any] = {"on_duplex": sink}
    if window is not None:
        options["window"] = window
    server, client, _ = await dialogue_pair(**options)
    chunk = b"d" * CHUNK
    start = time.perf_counter()
    async with client.duplex() as d:
        for _ in range(DUPLEX_BYTES // CHUNK):
            await d.send(chunk)
        await d.end()
        await done.wait()
    elapsed = time.perf_counter() - start
    await finish(server, client)
    return DUPLEX_BYTES / elapsed / 1e6


async def best(
    fn: Callable[[], Awaitable[float]], baseline: Callable[[], Awaitable[float]]
) -> tuple[float, float]:
    values: list[float] = []
    bases: list[float] = []
    for _ in range(ROUNDS):
        bases.append(await baseline())
        values.append(await fn())
    return max(values), max(bases)


async def main() -> None:
    report = Report("dialogue")
    value, base = await best(dialogue_messages, raw_messages)
    report.emit("messages_per_s", value, base, size=MESSAGE_SIZE, count=MESSAGES)
    value, base = await best(dialogue_requests, raw_requests)
    report.emit("requests_per_s", value, base, in_flight=IN_FLIGHT, count=REQUESTS)
    value, base = await best(dialogue_duplex, raw_duplex)
    report.emit("duplex_mb_per_s", value, base, chunk=CHUNK, total_mb=DUPLEX_BYTES >> 20)
    value, base = await best(lambda: dialogue_requests(async_handler=True), raw_requests)
    report.emit("requests_per_s_async_handler", value, base, in_flight=IN_FLIGHT)
    value, base = await best(lambda: dialogue_duplex(window=4 << 20), raw_duplex)
    report.emit("duplex_mb_per_s_flow_control", value, base, window=4 << 20)
    report.save()


if __name__ == "__main__":
    asyncio.run(main())
