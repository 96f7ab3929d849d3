"""The serve token's reach over HTTP (pipeline/chain/serve/auth.py), against a real server and Redis.

With ``serve_token`` set: ``/status.json``, ``/metrics`` and ``/ws`` need it
(``Authorization: Bearer`` or ``?token=``) and answer 401 with a Bearer
challenge without it; ``/healthz`` and the page's shell (``/``, its static
files) stay open. Without a token everything is open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from pipeline.chain.serve.server import create_app
from pipeline.settings import Settings

from .cdp import chromium, chromium_path

TOKEN = "s3cret-token"


@pytest.fixture
async def base(redis_url: str, lake_uri: str, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    settings = Settings.load(
        env={}, config_path="/nonexistent", redis_url=redis_url, lake_uri=lake_uri,
        serve_token=request.param,
    )  # fmt: skip
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


async def _status(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    async with session.get(url, headers=headers or {}) as reply:
        await reply.read()
        return reply.status, reply.headers.get("WWW-Authenticate", "")


@pytest.mark.parametrize("base", [TOKEN], indirect=True)
async def test_with_a_token_data_needs_it_and_probes_stay_open(base: str) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        for path in ("/status.json", "/metrics", "/ws"):
            assert await _status(session, base + path) == (401, 'Bearer realm="sluice"'), path
            assert (await _status(session, f"{base}{path}?token=wrong"))[0] == 401, path
            wrong = {"Authorization": "Bearer wrong"}
            assert (await _status(session, base + path, wrong))[0] == 401, path
        for path in ("/status.json", "/metrics"):
            assert (await _status(session, base + path, bearer))[0] == 200, path
            assert (await _status(session, f"{base}{path}?token={TOKEN}"))[0] == 200, path
        # open: the probe, and the page's shell (it holds no data)
        for path in ("/healthz", "/", "/static/status.js", "/static/status.css"):
            assert (await _status(session, base + path))[0] == 200, path
        async with session.get(base + "/metrics", headers=bearer) as reply:
            text = await reply.text()
        # three refusals each of /status.json, /metrics and /ws
        assert "sluice_serve_auth_failures_total 9" in text, text


@pytest.mark.parametrize("base", [""], indirect=True)
async def test_without_a_token_everything_is_open(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/status.json", "/metrics", "/healthz", "/"):
            assert (await _status(session, base + path))[0] == 200, path


@pytest.mark.skipif(chromium_path() is None, reason="chromium not installed (make install)")
@pytest.mark.parametrize("base", [TOKEN], indirect=True)
async def test_the_page_passes_its_token_on_and_says_when_it_has_none(
    base: str, tmp_path: Path
) -> None:
    live = "(document.getElementById('live') || {dataset: {}})"
    async with chromium(tmp_path / "profile", log=tmp_path / "chromium.log") as page:
        await page.goto(f"{base}/?token={TOKEN}")
        await page.wait_for(f"{live}.dataset.state === 'live'")
        await page.goto(f"{base}/")
        await page.wait_for(f"{live}.dataset.state === 'down'")
        assert "open this page as /?token=" in await page.evaluate(f"{live}.textContent")
