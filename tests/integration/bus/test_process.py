"""Two or three real buses on loopback, each twin with its own redis-server."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.envelope import Envelope
from pipeline.errors import CallFailed, HandlerError

from .conftest import eventually

pytestmark = pytest.mark.timeout(60)


async def echo(data: bytes, request: Envelope) -> bytes:
    return b"echo:" + data


def serve(twin: Any, **handlers: Any) -> tuple[Any, asyncio.Task[None]]:
    server = twin.server()
    for cmd, fn in handlers.items():
        server.handler(cmd.replace("_", "."))(fn)
    return server, asyncio.create_task(server.serve())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def raw_call(
    url: str, doc: dict[str, Any], answers: int, wait: float = 10
) -> list[dict[str, Any]]:
    """A client written only from the seed: RPUSH the JSON, BLPOP ``ret``."""
    client = aioredis.Redis.from_url(url)
    try:
        await client.rpush("msgbus.system.local", json.dumps(doc))
        out = []
        for _ in range(answers):
            popped = await client.blpop([doc["ret"]], timeout=wait)
            assert popped is not None, "no answer"
            out.append(json.loads(popped[1]))
        return out
    finally:
        await client.aclose()


def seed_request(cmd: str, dst: list[int], data: bytes, **fields: Any) -> dict[str, Any]:
    doc = {
        "ver": 1, "uid": "", "cmd": cmd, "exp": 3600, "try": 4,
        "dat": base64.b64encode(data).decode(), "src": 0, "dst": dst,
        "ret": str(uuid.uuid4()), "shm": "", "now": int(time.time()), "err": "",
    }  # fmt: skip
    doc.update(fields)
    return doc


async def test_raw_seed_client_call_between_two_twins(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    _, task = serve(b, wallet_balance=echo)
    try:
        [answer] = await raw_call(a.url, seed_request("wallet.balance", [b.id], b"GA7O"), 1)
    finally:
        await stop(task)
    assert set(answer) == {
        "ver",
        "uid",
        "cmd",
        "exp",
        "try",
        "dat",
        "src",
        "dst",
        "ret",
        "shm",
        "now",
        "err",
    }
    assert answer["err"] == ""
    assert base64.b64decode(answer["dat"]) == b"echo:GA7O"
    assert answer["src"] == b.id and answer["dst"] == [a.id]
    dst, counter = answer["uid"].split(".")
    assert dst == str(b.id) and int(counter) > 0  # the seed's dst.counter
    # the backlog is cleaned once answered; the counter moved
    ra = aioredis.Redis.from_url(a.url)
    assert await ra.hlen(keys.BUS_BACKLOG) == 0
    assert int(await ra.get(keys.bus_counter(b.id))) >= 1
    await ra.aclose()


async def test_answer_keeps_a_ret_with_slashes_quotes_and_unicode(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    _, task = serve(b, wallet_balance=echo)
    ret = f'caller/ünï "q" \\ {uuid.uuid4()}'
    try:
        doc = seed_request("wallet.balance", [b.id], b"x", ret=ret)
        [answer] = await raw_call(a.url, doc, 1)
    finally:
        await stop(task)
    assert answer["ret"] == ret and answer["err"] == ""
    assert base64.b64decode(answer["dat"]) == b"echo:x"


async def test_raw_seed_handler_with_literal_swap(twins):
    """A handler written from the seed swaps dst and src literally (src becomes a list)."""
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    rb = aioredis.Redis.from_url(b.url)

    async def handler() -> None:
        _, raw = await rb.blpop(["msgbus.calc.double"], timeout=10)
        msg = json.loads(raw)
        assert msg["ret"] == "msgbus.system.reply" and msg["src"] == a.id
        number = int(base64.b64decode(msg["dat"]))
        msg["src"], msg["dst"] = msg["dst"], msg["src"]
        msg["dat"] = base64.b64encode(str(number * 2).encode()).decode()
        msg["now"] = int(time.time())
        await rb.rpush("msgbus.system.reply", json.dumps(msg))

    try:
        answers = await asyncio.gather(
            handler(), raw_call(a.url, seed_request("calc.double", [b.id], b"21"), 1)
        )
    finally:
        await rb.aclose()
    [answer] = answers[1]
    assert base64.b64decode(answer["dat"]) == b"42"
    assert answer["src"] == b.id and answer["dst"] == [a.id] and answer["err"] == ""


async def test_sdk_call_multi_destination_and_same_twin(twins):
    a, b, c = twins(3)
    for t in (a, b, c):
        await t.start_bus()

    def who(twin: Any) -> Any:
        async def handler(data: bytes, request: Envelope) -> bytes:
            return f"{twin.id}:{data.decode()}".encode()

        return handler

    tasks = [serve(t, who_am_i=who(t))[1] for t in (a, b, c)]
    try:
        results = await a.client().call("who.am.i", dst=[c.id, a.id, b.id], data="x")
    finally:
        for task in tasks:
            await stop(task)
    assert results == [f"{c.id}:x".encode(), f"{a.id}:x".encode(), f"{b.id}:x".encode()]


async def test_unknown_destination_and_partial_failure(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    _, task = serve(b, echo=echo)
    try:
        [answer] = await raw_call(a.url, seed_request("echo", [4242], b""), 1)
        assert answer["err"] == "destination not found"
        assert answer["src"] == 4242
        with pytest.raises(CallFailed) as info:
            await a.client().call("echo", dst=[b.id, 4242], data=b"hi")
    finally:
        await stop(task)
    assert "destination not found" in str(info.value)
    ok, bad = info.value.answers
    assert ok.data == b"echo:hi" and not ok.err and bad.err == "destination not found"


async def test_handler_error_and_server_keeps_serving(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()

    async def picky(data: bytes, request: Envelope) -> bytes:
        if data == b"bad":
            raise HandlerError("invalid address format")
        if data == b"crash":
            raise RuntimeError("secret internal detail")
        return b"fine"

    _, task = serve(b, picky=picky)
    client = a.client()
    try:
        with pytest.raises(CallFailed, match="invalid address format"):
            await client.call("picky", dst=[b.id], data=b"bad")
        with pytest.raises(CallFailed) as info:
            await client.call("picky", dst=[b.id], data=b"crash")
        assert "secret" not in str(info.value) and "handler failed" in str(info.value)
        assert await client.call("picky", dst=[b.id], data=b"ok") == [b"fine"]
    finally:
        await stop(task)


async def test_a_slow_handler_delays_no_other_reply_of_its_batch(twins):
    (a,) = twins(1)
    held = asyncio.Event()

    async def mixed(data: bytes, request: Envelope) -> bytes:
        if data == b"hold":
            await held.wait()
        return b"done:" + data

    _, task = serve(a, mixed=mixed)  # default batch: all ten are popped together
    ra = aioredis.Redis.from_url(a.url)
    try:
        docs = [seed_request("mixed", [a.id], b"hold" if i == 0 else b"%d" % i, src=a.id)
                for i in range(10)]  # fmt: skip
        await ra.rpush(keys.bus_command("mixed"), *[json.dumps(d) for d in docs])
        answered = set()
        for _ in docs[1:]:  # answered while the first of the batch is still held
            popped = await ra.blpop([keys.BUS_REPLY], timeout=10)
            assert popped is not None, "a reply waited for the held handler"
            answered.add(base64.b64decode(json.loads(popped[1])["dat"]))
        assert answered == {b"done:%d" % i for i in range(1, 10)}
        assert await ra.llen(keys.BUS_REPLY) == 0
        held.set()
        popped = await ra.blpop([keys.BUS_REPLY], timeout=10)
        assert popped is not None
        assert base64.b64decode(json.loads(popped[1])["dat"]) == b"done:hold"
    finally:
        await stop(task)
        await ra.aclose()


async def test_expiry_when_nobody_handles(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    # nobody serves msgbus.nobody on b: the request waits there until a's scrubber expires it.
    # ``now`` is whole seconds, so exp=3 leaves 2-3 s to get there (exp=1 left as little as a
    # few ms: under load the forwarder rightly refused it as expired before sending).
    doc = seed_request("nobody", [b.id], b"", exp=3)
    call = asyncio.create_task(raw_call(a.url, doc, 1))
    rb = aioredis.Redis.from_url(b.url)
    try:
        deadline = time.monotonic() + 10
        while await rb.llen("msgbus.nobody") == 0:  # it did reach the remote side
            assert not call.done(), f"answered before it reached b: {call.result()}"
            assert time.monotonic() < deadline, "the request never reached b"
            await asyncio.sleep(0.02)
        [answer] = await call
        assert answer["err"] == "request expired"
        assert answer["src"] == b.id
        assert await rb.llen("msgbus.nobody") == 1  # expired where it waits, not taken from it
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await rb.aclose()
    # already expired when sent: answered at once
    [late] = await raw_call(
        a.url, seed_request("nobody", [b.id], b"", now=int(time.time()) - 100, exp=10), 1
    )
    assert late["err"] == "request expired"


async def test_retries_while_remote_bus_is_down(twins):
    a, b = twins(2)
    await a.start_bus()
    _, task = serve(b, echo=echo)
    client = a.client()
    try:
        call = asyncio.create_task(client.call("echo", dst=[b.id], data=b"late", retries=12))
        bus = a.bus
        assert bus is not None

        async def retrying() -> bool:
            return bus.forwarder.retried >= 2

        await eventually(retrying)
        assert not call.done()
        await b.start_bus()
        assert await asyncio.wait_for(call, 15) == [b"echo:late"]
        # once its time is up the caller gets an err, not silence: "remote unreachable"
        # (never delivered, safe to retry), as no attempt could connect
        await b.stop_bus()
        with pytest.raises(CallFailed, match="remote unreachable: cannot connect"):
            await client.call("echo", dst=[b.id], data=b"never", retries=1, exp=3)
    finally:
        await stop(task)


def test_requeue_past_the_end_is_one_line(redis_url, capsys) -> None:
    from pipeline.bus import cli

    assert cli.main(["requeue", "--index", "3", "--redis", redis_url]) == 2
    err = capsys.readouterr().err
    assert err == "sluice bus requeue: no dead letter at index 3 (0 held; see 'sluice bus dead')\n"


def test_the_bus_waits_for_its_redis(tmp_path) -> None:
    """``sluice bus`` started before its Redis says so in one line, then serves once Redis is up."""
    import subprocess
    import sys

    from pipeline.local.redisserver import LocalRedis
    from pipeline.runtime.ports import free_port

    server = LocalRedis(tmp_path / "redis")
    env = {
        **__import__("os").environ,
        "SLUICE_REDIS_URL": server.url,
        "SLUICE_BUS_LEGACY_PEERS": "1",
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    # asyncio's debug mode logs a slow step (> 0.1 s, a loaded machine) ahead of the line read
    env.pop("PYTHONASYNCIODEBUG", None)
    (tmp_path / "twins.json").write_text("{}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "bus", "--twin", "9",
         "--listen", f"127.0.0.1:{free_port()}", "--directory", str(tmp_path / "twins.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None and proc.stdout is not None
        first = proc.stderr.readline()
        assert first.startswith("sluice bus: waiting for redis:"), first
        server.start()
        assert proc.stderr.readline() == "sluice bus: redis is up\n"
        assert proc.stdout.readline().startswith("sluice bus: twin 9 listening on 127.0.0.1:")
        proc.terminate()
        _, rest = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        server.stop()


async def test_a_sender_that_lost_its_redis_issues_fresh_uids(twins):
    """After the sender's Redis is wiped, new calls are not refused as replays of old uids."""
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    _, task = serve(b, wallet_balance=echo)
    try:
        first = [
            (await raw_call(a.url, seed_request("wallet.balance", [b.id], b"x"), 1))[0]
            for _ in range(3)
        ]
        await a.stop_bus()
        wiped = aioredis.Redis.from_url(a.url)
        await wiped.flushall()  # the counter (and everything else) is gone
        await wiped.aclose()
        await a.start_bus()
        again = [
            (await raw_call(a.url, seed_request("wallet.balance", [b.id], b"y"), 1))[0]
            for _ in range(3)
        ]
    finally:
        await stop(task)
    assert [doc["err"] for doc in first + again] == [""] * 6
    old = {doc["uid"] for doc in first}
    assert not old & {doc["uid"] for doc in again}
