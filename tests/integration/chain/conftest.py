"""Fixtures of the chain integration tests: a real server on a free port, lake tables, a client."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pipeline.blockcodec import (
    Block,
    encode_block,
    parse_batch_result,
    parse_subbatch_result,
)
from pipeline.chain.client.ordered import BlockAssembler
from pipeline.chain.serve.server import create_app
from pipeline.lake.storage.tables import BLOCKS, BLOCKS_ARROW
from pipeline.settings import Settings

STREAM = "chain:test"


def write_foreign_block(client: Any, stream: str, num: int, hash: bytes, parent: bytes) -> bytes:
    """XADD a block map that Sluice's own codec would refuse (a foreign producer's entry)."""
    import msgpack

    from pipeline import keys
    from pipeline.blockcodec import ENTRY_FIELD

    packed = msgpack.packb({"num": num, "hash": hash, "parent": parent}, use_bin_type=True)
    client.xadd(keys.stream(stream), {ENTRY_FIELD: packed})
    return hash


def write_lake(
    lake_uri: str,
    blocks: Iterable[Block],
    canonical: set[bytes] | None = None,
    *,
    stream: str = STREAM,
) -> None:
    """Append blocks to the lake's ``blocks`` table (canonical = all, unless a hash set is given)."""
    from deltalake import write_deltalake

    rows = list(blocks)
    now = datetime.now(UTC)
    table = pa.table(
        {
            "stream": [stream] * len(rows),
            "num": [b.num for b in rows],
            "hash": [b.hash.hex() for b in rows],
            "parent": [b.parent.hex() for b in rows],
            "canonical": [canonical is None or b.hash in canonical for b in rows],
            "entry_id": [f"{i + 1}-0" for i in range(len(rows))],
            "entry_ms": [i + 1 for i in range(len(rows))],
            "payload": [encode_block(b) for b in rows],
            "archived_at": [now] * len(rows),
        },
        schema=BLOCKS_ARROW,
    )
    write_deltalake(
        f"{lake_uri}/{BLOCKS}",
        table,
        mode="append",
        configuration={"delta.enableDeletionVectors": "false"},
    )


@pytest.fixture
def settings(redis_url: str, lake_uri: str) -> Settings:
    return Settings.load(
        env={},
        redis_url=redis_url,
        lake_uri=lake_uri,
        serve_stream=STREAM,
        serve_send_buffer=256,
        serve_heartbeat_s=5.0,
        reorg_threshold=8,
    )


@pytest.fixture
def serve() -> Callable[..., Any]:
    @asynccontextmanager
    async def run(settings: Settings, **kwargs: Any) -> AsyncIterator[tuple[str, web.Application]]:
        app = create_app(settings, **kwargs)
        server = TestServer(app, host="127.0.0.1", shutdown_timeout=5)
        await server.start_server()
        try:
            yield f"http://127.0.0.1:{server.port}", app
        finally:
            await server.close()

    return run


class Client:
    """A raw websocket JSON-RPC client for the tests."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.session = session
        self.ws = ws
        self._id = 0
        self.assembler = BlockAssembler()
        self.other: list[Any] = []

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        self._id += 1
        await self.ws.send_str(
            json.dumps({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        )
        while True:
            reply = await self.recv()
            if reply.get("id") == self._id:
                return reply
            self.other.append(reply)

    async def recv(self, wait_s: float = 10.0) -> dict[str, Any]:
        msg = await self.ws.receive(timeout=wait_s)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"got {msg.type} {msg.data!r} {msg.extra!r}")
        out: dict[str, Any] = json.loads(msg.data)
        return out

    async def subscribe(
        self,
        num: int,
        block_hash: bytes,
        patterns: list[str] | None = None,
        opts: dict[str, bool] | None = None,
        *,
        weight: bool = True,
    ) -> str:
        """Subscribe; ``weight`` (the default) opts in so blocks compare equal with weights."""
        params: list[Any] = ["streams", hex(num), "0x" + block_hash.hex(), patterns or []]
        if weight:
            opts = {**(opts or {}), "weight": True}
        if opts is not None:
            params.append(opts)
        reply = await self.call("cardinal_subscribe", params)
        assert "result" in reply, reply
        return str(reply["result"])

    async def blocks(
        self,
        count: int,
        wait_s: float = 20.0,
        results: list[dict[str, Any]] | None = None,
        *,
        subscription: str | None = None,
    ) -> list[Block]:
        """The next ``count`` whole blocks, in arrival order (other notifications kept in ``results``).

        With ``subscription``, notifications of other subscriptions are dropped.
        """
        out: list[Block] = []
        pending = list(self.other)
        self.other.clear()
        async with asyncio.timeout(wait_s):
            while len(out) < count:
                obj = pending.pop(0) if pending else await self.recv(wait_s)
                if subscription is not None and obj["params"]["subscription"] != subscription:
                    continue
                result = obj["params"]["result"]
                if results is not None:
                    results.append(result)
                if result["type"] == "batch":
                    block = self.assembler.batch(parse_batch_result(result))
                elif result["type"] == "subbatch":
                    block = self.assembler.subbatch(*parse_subbatch_result(result))
                else:
                    block = None
                if block is not None:
                    out.append(block)
        return out


@pytest.fixture
def connect() -> Callable[..., Any]:
    @asynccontextmanager
    async def run(base: str, **kwargs: Any) -> AsyncIterator[Client]:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(base + "/ws", **kwargs) as ws,
        ):
            yield Client(session, ws)

    return run


# --- the Go programs built against github.com/openrelayxyz/cardinal-streams --------

GO_DIR = Path(__file__).resolve().parents[2] / "go"


def _go_sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(GO_DIR.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            digest.update(str(path.relative_to(GO_DIR)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def go_programs() -> dict[str, str]:
    """Paths of tests/go's programs, built once and cached outside the tree by source hash.

    The cache (``$SLUICE_GO_CACHE`` or ``~/.cache/sluice-go``) survives reruns:
    a rerun with unchanged sources builds nothing. Without ``go`` on PATH the
    test fails with the reason: Go is part of this project's toolchain.
    """
    go = shutil.which("go")
    if go is None:
        pytest.fail(
            "the cardinal-streams tests need the Go toolchain ('go' on PATH) to build tests/go"
        )
    root = Path(os.environ.get("SLUICE_GO_CACHE") or Path.home() / ".cache" / "sluice-go")
    out = root / _go_sources_digest()
    names = ("consumer", "producer")
    if not all((out / name).is_file() for name in names):
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=root))  # same filesystem: rename is atomic
        try:
            for name in names:
                done = subprocess.run(
                    [go, "build", "-mod=readonly", "-o", str(tmp / name), f"./{name}"],
                    cwd=GO_DIR,
                    capture_output=True,
                    text=True,
                    timeout=900,
                    check=False,
                )
                if done.returncode != 0:
                    pytest.fail(f"go build ./{name} failed:\n{done.stderr[-4000:]}")
            with contextlib.suppress(OSError):
                tmp.rename(out)  # a concurrent build of the same sources may have won
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    missing = [name for name in names if not (out / name).is_file()]
    if missing:
        pytest.fail(f"go build left no {missing} in {out}")
    return {name: str(out / name) for name in names}


class GoProcess:
    """One of tests/go's programs: JSON lines from stdout collected as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            self.lines.append(json.loads(raw))
            self._changed.set()
        self._changed.set()

    async def wait_for(self, predicate: Callable[[], bool], wait_s: float, what: str) -> None:
        """Wait until ``predicate()`` holds (checked after each line), at most ``wait_s``."""
        try:
            async with asyncio.timeout(wait_s):
                while not predicate():
                    if self._reader.done():
                        raise AssertionError(f"{what}: the program ended ({self.proc.returncode})")
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{what}: not within {wait_s}s; last lines {self.lines[-3:]}"
            ) from None

    async def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
        await self.proc.stdin.drain()

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            async with asyncio.timeout(5):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@pytest.fixture
def go_run(go_programs: dict[str, str]) -> Callable[..., Any]:
    """``async with go_run("consumer", *args) as proc``: a running Go program, ended after."""

    @asynccontextmanager
    async def run(name: str, *args: str) -> AsyncIterator[GoProcess]:
        proc = await asyncio.create_subprocess_exec(
            go_programs[name],
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,  # inherited: the library's warnings show in a failing test's output
        )
        program = GoProcess(proc)
        try:
            yield program
        finally:
            await program.close()

    return run


class CollectingSink:
    """A BlockSink keeping what it was given (catch-up only: nothing goes live here)."""

    def __init__(self) -> None:
        self.blocks: list = []
        self.head: int | None = None

    async def put(self, emits) -> None:
        self.blocks += emits

    def put_nowait(self, emits) -> None:
        self.blocks += emits

    def ready(self, num: int, hash: str) -> None:
        self.head = num


async def apply_updates(updates: Any, state: dict[int, bytes], done: Callable[[Any], bool]) -> None:
    """Apply a Sluice client's updates to ``state`` (num -> hash) until an added block is
    ``done``; each removal must name the block ``state`` holds at its height."""
    from pipeline.chain.client.ordered import Added

    async for update in updates:
        if isinstance(update, Added):
            state[update.block.num] = update.block.hash
            if done(update.block):
                return
        else:
            assert state.pop(update.num) == update.hash
