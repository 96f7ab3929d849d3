"""The asyncio layer over a real socketpair: requests, messages, duplexes, close, failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.dialogue.channel import READ_SIZE
from pipeline.dialogue.connection import HANDLER_FAILED, NO_HANDLER, Connection
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.states import State
from pipeline.errors import DialogueClosed, DuplexError, RequestCancelled
from tests.support.poll import settled, until


async def echo_upper(data: bytes) -> bytes:
    return data.upper()


async def test_messages_sync_and_async_handlers(connect: Any) -> None:
    got_sync: list[bytes] = []
    got_async: list[bytes] = []

    async def on_async(data: bytes) -> None:
        await asyncio.sleep(0)
        got_async.append(data)

    client, server = await connect(
        client={"on_message": on_async}, server={"on_message": got_sync.append}
    )
    for i in range(100):
        await client.send_message(b"c%d" % i)
        await server.send_message(b"s%d" % i)
    await until(lambda: len(got_sync) == 100 and len(got_async) == 100)
    assert got_sync == [b"c%d" % i for i in range(100)]
    assert got_async == [b"s%d" % i for i in range(100)]


async def test_requests_sync_and_async_handlers(connect: Any) -> None:
    client, server = await connect(
        client={"on_request": lambda data: data[::-1]}, server={"on_request": echo_upper}
    )
    results = await asyncio.gather(*(client.request(b"req%d" % i, timeout=5) for i in range(200)))
    assert results == [b"REQ%d" % i for i in range(200)]
    assert await server.request(b"abc") == b"cba"


async def test_declined_failed_and_unhandled_requests(connect: Any) -> None:
    async def handler(data: bytes) -> bytes | None:
        if data == b"boom":
            raise ValueError("handler bug, never sent to the peer")
        return None

    client, server = await connect(server={"on_request": handler})
    with pytest.raises(RequestCancelled):
        await client.request(b"decline me")
    with pytest.raises(RequestCancelled):
        await client.request(b"boom")
    with pytest.raises(RequestCancelled):
        await server.request(b"the client has no handler")


async def test_timeout_cancels_on_the_wire_and_the_handler(connect: Any) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(data: bytes) -> bytes:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b"never"

    client, server = await connect(server={"on_request": slow})
    with pytest.raises(TimeoutError):
        await client.request(b"q", timeout=0.2)
    async with asyncio.timeout(5):
        await cancelled.wait()
    assert started.is_set()
    assert client.protocol.outstanding()[0] == 0
    assert server.protocol.outstanding()[1] == 0


async def test_caller_cancellation_cancels_on_the_wire(connect: Any) -> None:
    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def slow(data: bytes) -> bytes:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            cancelled.set()
        return b""

    client, _ = await connect(server={"on_request": slow})
    task = asyncio.create_task(client.request(b"q"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await cancelled.wait()


async def test_response_racing_the_cancel_is_ignored(connect: Any) -> None:
    release = asyncio.Event()

    async def handler(data: bytes) -> bytes:
        await release.wait()
        return b"late"

    client, server = await connect(server={"on_request": handler})
    task = asyncio.create_task(client.request(b"q"))
    await until(lambda: server.protocol.outstanding()[1])
    release.set()  # the server answers while ...
    task.cancel()  # ... the client cancels
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.request(b"still fine") == b"late"
    assert client.error is None and server.error is None


async def duplex_echo(duplex: Duplex) -> None:
    async for chunk in duplex:
        await duplex.send(chunk.upper())


async def test_duplex_echo(connect: Any) -> None:
    client, _ = await connect(server={"on_duplex": duplex_echo})
    async with client.duplex(b"hello") as d:
        for i in range(20):
            await d.send(b"part%d" % i)
        await d.end()
        got = [chunk async for chunk in d]
    assert got == [b"PART%d" % i for i in range(20)]


async def test_duplex_initial_data_and_server_opened_duplex(connect: Any) -> None:
    seen: list[bytes | None] = []

    async def on_duplex(d: Duplex) -> None:
        seen.append(d.initial)
        await d.send(b"from the client side")

    client, server = await connect(client={"on_duplex": on_duplex})
    async with server.duplex(b"init") as d:
        assert [chunk async for chunk in d] == [b"from the client side"]
    assert seen == [b"init"]


async def test_half_close_upload_then_single_response(connect: Any) -> None:
    async def summer(d: Duplex) -> None:
        total = 0
        async for chunk in d:  # until the client's DuplexRequestEnd
            total += len(chunk)
        await d.send(b"%d" % total)  # ... and still send after the peer ended

    client, _ = await connect(server={"on_duplex": summer})
    async with client.duplex() as d:
        for _ in range(10):
            await d.send(b"x" * 1000)
        await d.end()
        assert await d.receive() == b"10000"
        assert await d.receive() is None


async def test_half_close_server_ends_first_client_keeps_sending(connect: Any) -> None:
    received: list[bytes] = []

    async def listener(d: Duplex) -> None:
        await d.end()  # our half is done at once
        async for chunk in d:
            received.append(chunk)

    client, _ = await connect(server={"on_duplex": listener})
    async with client.duplex() as d:
        assert await d.receive() is None  # the server's half ended
        for i in range(5):
            await d.send(b"%d" % i)
    await until(lambda: len(received) == 5)
    assert received == [b"0", b"1", b"2", b"3", b"4"]


async def test_duplex_errors_reach_the_peer(connect: Any) -> None:
    async def failing(d: Duplex) -> None:
        await d.receive()
        raise RuntimeError("internal detail")

    client, server = await connect(server={"on_duplex": failing})
    async with client.duplex() as d:
        await d.send(b"x")
        with pytest.raises(DuplexError) as info:
            await d.receive()
        assert info.value.data == HANDLER_FAILED
    # No handler: the duplex is refused with an error.
    async with server.duplex() as d:
        with pytest.raises(DuplexError) as info:
            await d.receive()
        assert info.value.data == NO_HANDLER

    # An explicit error end.
    async def reader(d: Duplex) -> None:
        with pytest.raises(DuplexError) as info:
            async for _ in d:
                pass
        assert info.value.data == b"stop"

    client2, _ = await connect(server={"on_duplex": reader})
    async with client2.duplex() as d:
        await d.end(b"stop")
    await client2.close()
    assert client2.error is None


async def test_close_with_requests_and_duplexes_outstanding(connect: Any) -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def slow(data: bytes) -> bytes:
        started.append("request")
        await release.wait()
        return b"finished " + data

    async def streamer(d: Duplex) -> None:
        started.append("duplex")
        await release.wait()
        await d.send(b"final chunk")

    client, server = await connect(server={"on_request": slow, "on_duplex": streamer})
    pending = asyncio.create_task(client.request(b"job"))
    duplex = client.duplex()
    await duplex.send(b"x")
    await until(lambda: len(started) == 2, "both handlers running on the server")
    closing = asyncio.create_task(client.close(timeout=5))
    await until(lambda: server.protocol.state is State.CLOSING, "the server got the close")
    assert not client.closed  # the server is finishing what is outstanding
    with pytest.raises(DialogueClosed):
        await client.request(b"new work")
    release.set()
    assert await pending == b"finished job"
    assert await duplex.receive() == b"final chunk"
    assert await duplex.receive() is None
    await closing
    await server.wait_closed()
    assert client.close_reason == server.close_reason == "closed"


async def test_server_initiated_close(connect: Any) -> None:
    client, server = await connect(server={"on_request": echo_upper})
    assert await client.request(b"a") == b"A"
    await server.close(timeout=5)
    await client.wait_closed()
    assert client.close_reason == "closed" and server.close_reason == "closed"
    with pytest.raises(DialogueClosed):
        await client.request(b"b")
    await client.close()  # twice is fine
    await server.close()


async def test_peer_disappears(connect: Any) -> None:
    started = asyncio.Event()

    async def hang(data: bytes) -> bytes:
        started.set()
        await asyncio.sleep(30)
        return b""

    async def hang_duplex(d: Duplex) -> None:
        await asyncio.sleep(30)

    client, server = await connect(server={"on_request": hang, "on_duplex": hang_duplex})
    pending = asyncio.create_task(client.request(b"q"))
    duplex = client.duplex()
    await started.wait()
    server.channel.abort()  # the server vanishes without a word
    with pytest.raises(DialogueClosed):
        await pending
    with pytest.raises(DialogueClosed):
        await duplex.receive()
    with pytest.raises(DialogueClosed):
        await duplex.send(b"x")
    await client.wait_closed()
    assert client.close_reason is not None


async def test_garbage_from_the_peer_is_a_protocol_error(connect: Any) -> None:
    client, server = await connect()
    pending = asyncio.create_task(client.request(b"q"))
    await asyncio.sleep(0)
    assert isinstance(server.channel, object)
    server.channel.writer.write(b"\xff" * 20)  # type: ignore[attr-defined]
    with pytest.raises(DialogueClosed):
        await pending
    await client.wait_closed()
    assert client.error is not None and "unknown packet type" in str(client.error)


async def test_close_is_bounded_when_the_peer_never_answers() -> None:
    import socket

    a, b = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=a)
    from pipeline.dialogue.protocol import Role

    client = Connection.over_streams(reader, writer, Role.CLIENT)
    client.start()
    # b never reads nor answers: unbounded, close would wait forever (60 s bounds that)
    await asyncio.wait_for(client.close(timeout=0.3), 60)
    assert client.close_reason == "close timed out"
    b.close()


async def test_slow_reader_seed_wire_bounded_queue(connect: Any) -> None:
    chunk = b"z" * 65536

    async def producer(d: Duplex) -> None:
        for _ in range(64):  # 4 MiB, far over the 256 KiB queue bound
            await d.send(chunk)

    client, server = await connect(
        client={"duplex_queue_bytes": 1 << 18}, server={"on_duplex": producer}
    )
    async with client.duplex() as d:  # a slow reader: reads nothing until the queue is full
        stats = d.statistics
        await until(lambda: stats()["queued_bytes"] >= stats()["high"], "queue at its watermark")
        queued = await settled(lambda: stats()["queued_bytes"])  # reading stopped there
        # Reading stopped at the bound (plus what the last read of the socket held).
        bound = (1 << 18) + READ_SIZE + 65536
        assert 0 < queued <= bound
        total = 0
        async for data in d:
            total += len(data)
            assert d.statistics()["queued_bytes"] <= bound
        assert total == 64 * 65536


async def test_flow_control_slow_duplex_does_not_block_others(connect: Any) -> None:
    chunk = b"z" * 16384
    window = 1 << 16

    async def producer(d: Duplex) -> None:
        for _ in range(64):  # 1 MiB against a 64 KiB window
            await d.send(chunk)

    options = {"window": window, "on_duplex": producer, "on_request": echo_upper}
    client, server = await connect(client={"window": window}, server=options)
    assert client.protocol.window == window
    async with client.duplex() as d:
        flow = (client.protocol, server.protocol)
        await until(lambda: all(p.flow_control for p in flow), "flow control negotiated")
        # Not reading: the producer fills the window, then waits for credit.
        await until(lambda: d.statistics()["queued_bytes"] >= window, "the window filled")
        assert await settled(lambda: d.statistics()["queued_bytes"]) <= window + 16384
        # No head-of-line blocking: other traffic still flows on the connection.
        assert await client.request(b"meanwhile", timeout=5) == b"MEANWHILE"
        total = 0
        async for data in d:
            total += len(data)
        assert total == 64 * 16384


async def test_local_misuse_is_refused_with_clear_errors(connect: Any) -> None:
    from pipeline.errors import LocalProtocolError, PayloadTooLarge

    client, _ = await connect(
        client={"max_frame": 1024}, server={"on_duplex": duplex_echo, "on_request": echo_upper}
    )
    with pytest.raises(PayloadTooLarge):
        await client.send_message(b"x" * 1025)
    with pytest.raises(PayloadTooLarge):
        await client.request(b"x" * 1025)
    async with client.duplex() as d:
        await d.end()
        with pytest.raises(DialogueClosed):
            await d.send(b"after end")
    with pytest.raises(LocalProtocolError):
        client.protocol.duplex_send(999, True, b"no such duplex")
    # Nothing was lost or broken by the refused calls: the connection still works.
    assert await client.request(b"x" * 10, timeout=5) == b"X" * 10


async def test_too_many_handlers_pause_reading_until_they_finish(connect: Any) -> None:
    release = asyncio.Event()

    async def slow(data: bytes) -> bytes:
        await release.wait()
        return data

    client, server = await connect(server={"on_request": slow, "max_handlers": 4})
    calls = [asyncio.create_task(client.request(b"%d" % i, timeout=10)) for i in range(20)]
    await until(lambda: len(server._runner.tasks()) >= 4)
    assert not server._read_allowed.is_set()  # the reader stopped: no unbounded task growth
    release.set()
    assert await asyncio.gather(*calls) == [b"%d" % i for i in range(20)]
    assert server._read_allowed.is_set()
