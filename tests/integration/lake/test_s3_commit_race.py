"""Which mechanism keeps racing commits on S3: the store refusing a second create.

Two delta-rs writers append to one table at the same version. Between them and
the real S3 server (versitygw) sits a forwarding HTTP proxy that holds the
request writing a commit file (``_delta_log/<version>.json``) until the other
writer's request for the same file has arrived, then lets both through at
once: the race that, unforced, happens only now and then.

delta-rs 1.6.6 writes every commit as a create-only PUT (``If-None-Match: *``)
whichever of Sluice's two ``lake_s3_conditional_put`` settings is chosen
(``etag`` sets ``AWS_CONDITIONAL_PUT``, ``unsafe-rename``
``AWS_S3_ALLOW_UNSAFE_RENAME``; neither changes how a commit file is written).
The store answers the second create 412, delta-rs retries that commit as the
next version, and both commits are in the table. That refusal is the whole
protection: the same race through a store that ignores ``If-None-Match`` (the
proxy removes the first commit file from the store's directory just before the
second create reaches it, as such a store would overwrite it) loses one
writer's rows without an error. Hence the racing-commit tests of test_s3.py pass with either
setting, and an S3 store for the lake must honour conditional writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp import ClientSession, web
from yarl import URL

from pipeline.lake.storage import store
from pipeline.local.s3 import LocalStore
from pipeline.runtime.ports import free_port
from tests.integration.lake.helpers import settings_for

#: A commit file of a Delta table (not the writer's temporary file).
COMMIT = re.compile(r"/_delta_log/\d{20}\.json$")
#: Longest a held commit waits for its racer (bounds a hang; the race needs ~0 s).
PAIR_WAIT_S = 30.0
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


@dataclass
class RaceProxy:
    """Forwards every request to ``upstream``; pairs the two PUTs of one commit file.

    The first of the pair is forwarded first, the second once it was answered; the first's
    answer is returned once the second's was.
    """

    upstream: str
    #: the store's directory (versitygw posix: ``DIR/bucket/key``)
    directory: Path
    port: int = field(default_factory=free_port)
    #: (method, path, If-None-Match, copy source?, status) of every commit-file request
    commits: list[tuple[str, str, str, bool, int]] = field(default_factory=list)
    _waiting: dict[str, asyncio.Event] = field(default_factory=dict)
    #: set by the test once the table exists: commits before it pass straight through
    armed: bool = False
    #: make the store forget the first commit before the second create (no conditional writes)
    ignore_conditions: bool = False

    def __post_init__(self) -> None:
        self._answered = asyncio.Event()
        self._done = asyncio.Event()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if self.armed and request.method == "PUT" and COMMIT.search(path):
            pending = self._waiting.get(path)
            if pending is None:  # first of the pair: wait for the racer
                self._waiting[path] = event = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), PAIR_WAIT_S)
                try:
                    answer = await self.forward(request)
                finally:
                    self._answered.set()
                # its writer learns of its commit only after the racer's was answered
                await asyncio.wait_for(self._done.wait(), PAIR_WAIT_S)
                return answer
            # the racer: release the first, pass every later commit straight through
            self.armed = False
            pending.set()
            try:
                await asyncio.wait_for(self._answered.wait(), PAIR_WAIT_S)
                if self.ignore_conditions:
                    (self.directory / path.lstrip("/")).unlink()
                return await self.forward(request)
            finally:
                self._done.set()
        return await self.forward(request)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        url = URL(self.upstream + request.raw_path, encoded=True)
        async with self.session.request(
            request.method, url, headers=headers, data=body, skip_auto_headers=("Content-Type",)
        ) as reply:
            payload = await reply.read()
            if request.method == "PUT" and COMMIT.search(path):
                self.commits.append(
                    (
                        request.method,
                        path,
                        request.headers.get("If-None-Match", ""),
                        "x-amz-copy-source" in request.headers,
                        reply.status,
                    )
                )
            out = {k: v for k, v in reply.headers.items() if k.lower() not in HOP}
            return web.Response(status=reply.status, headers=out, body=payload)

    async def serve(self, ready: threading.Event, stop: asyncio.Event) -> None:
        self.session = ClientSession(auto_decompress=False)
        server = web.Server(self.handle)
        runner = web.ServerRunner(server)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        ready.set()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            await self.session.close()


@pytest.fixture
def proxy(s3_store: LocalStore) -> Iterator[RaceProxy]:
    proxy = RaceProxy(s3_store.endpoint, s3_store.directory)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(proxy.serve(ready, stop))

    thread = threading.Thread(target=run, name="race-proxy", daemon=True)
    thread.start()
    assert ready.wait(30), "the proxy did not start"
    try:
        yield proxy
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def _race(settings: Any, proxy: RaceProxy) -> tuple[list[str], int]:
    """Create a table, then two appends at once; (writers whose row is kept, version)."""
    from deltalake import write_deltalake

    uri = settings.lake.table("race")
    options = store.delta_options(settings.lake)
    schema = pa.schema([("writer", pa.string())])
    write_deltalake(uri, pa.table({"writer": ["base"]}, schema=schema), storage_options=options)
    proxy.armed = True

    def append(name: str) -> None:
        table = pa.table({"writer": [name]}, schema=schema)
        write_deltalake(uri, table, mode="append", storage_options=options)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(append, ["a", "b"]))
    table = store.open_table(settings.lake, "race")
    return sorted(table.to_pyarrow_table().column("writer").to_pylist()), table.version()


def _settings(redis_url: str, s3_lake: dict[str, Any], proxy: RaceProxy, mode: str) -> Any:
    return settings_for(
        redis_url, **{**s3_lake, "lake_s3_endpoint": proxy.endpoint}, lake_s3_conditional_put=mode
    )


def _first_commits(proxy: RaceProxy) -> list[tuple[str, int]]:
    """(If-None-Match, status) of the racing writers' requests for version 1."""
    return sorted(
        (c[2], c[4]) for c in proxy.commits if c[1].endswith("/00000000000000000001.json")
    )


@pytest.mark.parametrize("mode", ["etag", "unsafe-rename"])
def test_the_store_refuses_the_second_create_and_delta_rs_retries_it(
    redis_url: str, s3_lake: dict[str, Any], proxy: RaceProxy, mode: str
) -> None:
    settings = _settings(redis_url, s3_lake, proxy, mode)
    kept, version = _race(settings, proxy)
    assert kept == ["a", "b", "base"]
    assert version == 2
    # Both writers put version 1 at once, each only if absent; the store refused one.
    assert _first_commits(proxy) == [("*", 200), ("*", 412)], proxy.commits


def test_a_store_ignoring_conditional_writes_loses_a_racing_commit(
    redis_url: str, s3_lake: dict[str, Any], proxy: RaceProxy
) -> None:
    proxy.ignore_conditions = True
    settings = _settings(redis_url, s3_lake, proxy, "etag")
    kept, version = _race(settings, proxy)
    # Both creates of version 1 "succeeded": the last one overwrote the first.
    assert _first_commits(proxy) == [("*", 200), ("*", 200)], proxy.commits
    assert version == 1 and len(kept) == 2 and kept[-1] == "base", kept
