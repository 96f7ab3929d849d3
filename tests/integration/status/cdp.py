"""A headless Chromium driven over the Chrome DevTools Protocol (aiohttp's websocket client).

Just what the status page test needs: open a page, evaluate JavaScript,
take a screenshot. Chromium is Debian's ``/usr/bin/chromium`` (or
``SLUICE_CHROMIUM``), started with a fresh profile and the flags that keep it
off the network; it runs in its own process group, ended as a whole.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


def chromium_path() -> str | None:
    return os.environ.get("SLUICE_CHROMIUM") or shutil.which("chromium")


class CdpError(RuntimeError):
    pass


class Page:
    """One page target: ``send`` a CDP command and wait for its reply (events are ignored)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self._ws.send_str(
            json.dumps({"id": msg_id, "method": method, "params": params or {}})
        )
        while True:
            msg = await self._ws.receive(timeout=30)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise CdpError(f"devtools connection ended: {msg.type} {msg.data!r}")
            reply = json.loads(msg.data)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        reply = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in reply:
            raise CdpError(f"{expression[:80]}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, *, wait_s: float = 20.0) -> Any:
        """Poll until ``expression`` is truthy; its value. Raises ``TimeoutError`` with the last value."""
        deadline = time.monotonic() + wait_s
        value = None
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{expression[:120]} still {value!r} after {wait_s}s")

    async def goto(self, url: str) -> None:
        await self.send("Page.enable")
        await self.send("Page.navigate", {"url": url})

    async def screenshot(self, path: Path) -> None:
        reply = await self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
        )
        await asyncio.to_thread(_write, path, base64.b64decode(reply["data"]))


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


async def _devtools_port(profile: Path, proc: subprocess.Popen[bytes], wait_s: float) -> int:
    """Chromium writes the port it picked into ``DevToolsActivePort`` of the profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CdpError(f"chromium exited with {proc.returncode}")
        if marker.is_file():
            first = marker.read_text().splitlines()[:1]
            if first and first[0].isdigit():
                return int(first[0])
        await asyncio.sleep(0.05)
    raise CdpError(f"chromium wrote no {marker.name} in {wait_s}s")


def _launch(profile: Path, log: Path | None, width: int, height: int) -> subprocess.Popen[bytes]:
    exe = chromium_path()
    if exe is None:
        raise CdpError("chromium not found (scripts/ensure-chromium.sh installs it)")
    profile.mkdir(parents=True, exist_ok=True)
    with open(log or os.devnull, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
            + ["about:blank"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End Chromium's whole process group (its own: started with a new session)."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@asynccontextmanager
async def chromium(
    profile: Path, *, width: int = 1360, height: int = 1000, log: Path | None = None
) -> AsyncIterator[Page]:
    """A fresh headless Chromium with one blank page; stopped (whole process group) on exit."""
    proc = await asyncio.to_thread(_launch, profile, log, width, height)
    try:
        port = await _devtools_port(profile, proc, wait_s=30)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as reply:
                targets = await reply.json()
            page_target = next(t for t in targets if t.get("type") == "page")
            async with session.ws_connect(
                page_target["webSocketDebuggerUrl"], max_msg_size=64 << 20
            ) as ws:
                page = Page(ws)
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                yield page
    finally:
        await asyncio.to_thread(_stop, proc)
