"""Real network faults for the tests: a Toxiproxy server and a small client of its API.

Toxiproxy (Shopify's TCP proxy for fault injection) sits between a client and a
server: each :class:`Proxy` listens on a free loopback port and forwards to an
upstream port, and the faults ("toxics") are switched on and off through its HTTP
API while connections are open. ``make install`` builds ``toxiproxy-server``
:data:`VERSION` once from the Go module proxy into
``~/.cache/sluice-toxiproxy/<version>/`` (``scripts/ensure-toxiproxy.sh``); the
fixtures skip with a reason only when it is missing.

What each fault does to a connection, per toxiproxy's source (v2.12.0):

- :meth:`Proxy.latency`: every chunk of the stream waits ``ms`` (+/- ``jitter``).
- :meth:`Proxy.cut`: the proxy is disabled: its listener is closed (a new connection
  is refused) and every open connection is closed, before the call returns.
  :meth:`Proxy.restore` listens again.
- :meth:`Proxy.half_open`: the ``timeout`` toxic with timeout 0: data is dropped and
  the connection stays established (no FIN, no RST), as when a peer vanishes.
  Removing it (:meth:`Proxy.clear`) closes the connections it held.
- :meth:`Proxy.slow`: the ``bandwidth`` toxic, in whole KB/s (1000 bytes).
- :meth:`Proxy.reset_peer`: a connection opened after this call is reset (RST) at
  its first data on ``stream``; one already open is closed (FIN) instead, since
  toxiproxy sets SO_LINGER 0 only when a connection starts.

The client is synchronous (stdlib ``urllib``, loopback, milliseconds a call); from
a coroutine, call it through ``asyncio.to_thread`` if a blocked loop matters.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Self

import pytest

from pipeline.local.proc import LocalProcess
from pipeline.runtime.ports import free_port

VERSION = "v2.12.0"
Stream = Literal["downstream", "upstream"]
_STREAMS = ("downstream", "upstream")
#: Deadline of one API call and of the server's start (a loaded machine is slow).
API_TIMEOUT_S = 10.0
START_TIMEOUT_S = 15.0


class ToxiproxyError(RuntimeError):
    """The Toxiproxy API refused a call or could not be reached (one line, its message)."""


def binary_path(version: str = VERSION) -> Path:
    """Where ``toxiproxy-server`` of ``version`` is cached (``$SLUICE_TOXIPROXY_CACHE`` or ~/.cache)."""
    root = os.environ.get("SLUICE_TOXIPROXY_CACHE") or str(
        Path.home() / ".cache" / "sluice-toxiproxy"
    )
    return Path(root) / version / "toxiproxy-server"


def missing() -> str | None:
    """Why Toxiproxy cannot run here (None: it can)."""
    exe = binary_path()
    if exe.is_file() and os.access(exe, os.X_OK):
        return None
    return f"toxiproxy-server {VERSION} not found at {exe} (make install builds it: scripts/ensure-toxiproxy.sh)"


# the API is on loopback: never through an HTTP proxy named by the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _Api:
    """JSON over HTTP to one toxiproxy-server; every failure is a one-line ToxiproxyError."""

    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with _OPENER.open(request, timeout=API_TIMEOUT_S) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(
                f"toxiproxy {method} {path}: HTTP {exc.code}: {_message(exc.read())}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ToxiproxyError(
                f"toxiproxy {method} {path}: {' '.join(str(reason).split())}"
            ) from None
        return json.loads(raw) if raw.strip() else None


def _message(raw: bytes) -> str:
    """The ``error`` of an API error document, else its text, on one line."""
    try:
        text = str(json.loads(raw).get("error", ""))
    except (ValueError, AttributeError):
        text = raw.decode(errors="replace")
    return " ".join(text.split()) or "(no message)"


class Proxy:
    """One proxy of a :class:`Toxiproxy`: clients connect to (:attr:`host`, :attr:`port`)."""

    def __init__(self, api: _Api, name: str, host: str, port: int, upstream: str) -> None:
        self._api = api
        self.name = name
        self.host = host
        self.port = port
        self.upstream = upstream

    def __repr__(self) -> str:
        return f"Proxy({self.name!r}, {self.host}:{self.port} -> {self.upstream})"

    @property
    def _path(self) -> str:
        return f"/proxies/{urllib.parse.quote(self.name, safe='')}"

    def _toxic(self, kind: str, stream: str, **attributes: int) -> str:
        if stream not in _STREAMS:
            raise ValueError(f"{kind}: stream must be 'downstream' or 'upstream', got {stream!r}")
        for key, value in attributes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{kind}: {key} must be a whole number >= 0, got {value!r}")
        name = f"{kind}_{stream}"
        body = {"name": name, "type": kind, "stream": stream, "attributes": attributes}
        self._api.call("POST", f"{self._path}/toxics", body)
        return name

    def latency(self, ms: int, jitter: int = 0, stream: Stream = "downstream") -> str:
        """Delay every chunk on ``stream`` by ``ms`` (+/- ``jitter``) milliseconds; its toxic's name."""
        return self._toxic("latency", stream, latency=ms, jitter=jitter)

    def half_open(self, stream: Stream | Literal["both"] = "both") -> list[str]:
        """Drop all data on ``stream`` (default: both ways) while connections stay open."""
        streams = _STREAMS if stream == "both" else (stream,)
        return [self._toxic("timeout", s, timeout=0) for s in streams]

    def slow(self, bytes_per_s: int, stream: Stream = "downstream") -> str:
        """Limit ``stream`` to ``bytes_per_s``, rounded down to whole KB/s (>= 1000)."""
        if not isinstance(bytes_per_s, int) or bytes_per_s < 1000:
            raise ValueError(
                f"slow: toxiproxy's bandwidth is in whole KB/s, so bytes_per_s must be >= 1000, got {bytes_per_s!r}"
            )
        return self._toxic("bandwidth", stream, rate=bytes_per_s // 1000)

    def reset_peer(self, timeout_ms: int = 0, stream: Stream = "downstream") -> str:
        """Reset (RST) new connections at their first data on ``stream``, after ``timeout_ms``."""
        return self._toxic("reset_peer", stream, timeout=timeout_ms)

    def cut(self) -> None:
        """Disable the proxy: new connections are refused, open ones closed."""
        self._api.call("PATCH", self._path, {"enabled": False})

    def restore(self) -> None:
        """Enable the proxy again (its toxics stay; :meth:`clear` removes them)."""
        self._api.call("PATCH", self._path, {"enabled": True})

    def point(self, port: int, host: str = "127.0.0.1") -> None:
        """Send new connections to ``host:port`` (a load balancer's next pick); Toxiproxy
        restarts the proxy for it, so open connections are closed."""
        upstream = f"{host}:{port}"
        self._api.call("PATCH", self._path, {"upstream": upstream})
        self.upstream = upstream

    def toxics(self) -> list[str]:
        """The names of the proxy's toxics."""
        return [str(t["name"]) for t in self._api.call("GET", f"{self._path}/toxics")]

    def clear(self) -> None:
        """Remove every toxic of the proxy."""
        for name in self.toxics():
            self._api.call("DELETE", f"{self._path}/toxics/{urllib.parse.quote(name, safe='')}")

    def delete(self) -> None:
        """Remove the proxy: its port stops listening, its connections are closed."""
        self._api.call("DELETE", self._path)


class Toxiproxy(LocalProcess):
    """A ``toxiproxy-server`` child process whose API listens on a free loopback port.

    ``with Toxiproxy() as tp:`` starts it and waits for its API; leaving the block
    kills it (SIGKILL, then wait). Its output goes to ``log`` (default: discarded).
    """

    def __init__(self, exe: Path | None = None, *, log: Path | None = None) -> None:
        super().__init__()
        self.exe = exe or binary_path()
        self.log = log
        self.port = 0
        self.api = _Api("")

    def start(self, timeout: float = START_TIMEOUT_S) -> Self:
        if not (self.exe.is_file() and os.access(self.exe, os.X_OK)):
            raise ToxiproxyError(
                f"{self.exe} is not an executable (make install builds toxiproxy-server {VERSION}:"
                " scripts/ensure-toxiproxy.sh)"
            )
        self.port = free_port()
        self.api = _Api(f"http://127.0.0.1:{self.port}")
        self.proc = self._spawn([str(self.exe), "-host", "127.0.0.1", "-port", str(self.port)])
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise ToxiproxyError(
                    f"toxiproxy-server exited with {code} at start{self._see_log()}"
                )
            try:
                self.api.call("GET", "/version")
                return self
            except ToxiproxyError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise ToxiproxyError(
                        f"toxiproxy-server on port {self.port} did not answer in {timeout}s{self._see_log()}"
                    ) from None
                time.sleep(0.02)

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "LOG_LEVEL": "warn"}
        if self.log is None:
            return subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env
            )
        with open(self.log, "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def _see_log(self) -> str:
        return f"; see {self.log}" if self.log else ""

    def stop(self) -> None:
        """Kill the server and wait for it; safe to call twice."""
        self.kill()

    def proxy(self, name: str, upstream_port: int, upstream_host: str = "127.0.0.1") -> Proxy:
        """A new enabled proxy on a free 127.0.0.1 port forwarding to the upstream."""
        port = free_port()
        upstream = f"{upstream_host}:{upstream_port}"
        body = {"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream, "enabled": True}
        self.api.call("POST", "/proxies", body)
        return Proxy(self.api, name, "127.0.0.1", port, upstream)

    def proxies(self) -> list[str]:
        """The names of the server's proxies."""
        return sorted(self.api.call("GET", "/proxies"))

    def reset(self) -> None:
        """Enable every proxy and remove every toxic (toxiproxy's ``POST /reset``)."""
        self.api.call("POST", "/reset")

    def delete_all(self) -> None:
        """Remove every proxy (their ports stop listening, their connections close)."""
        for name in self.proxies():
            self.api.call("DELETE", f"/proxies/{urllib.parse.quote(name, safe='')}")


@pytest.fixture(scope="session")
def toxiproxy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    """The session's toxiproxy-server (skips with the reason when it is not installed)."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log"
    with Toxiproxy(log=log) as server:
        yield server


@pytest.fixture
def toxiproxy(toxiproxy_server: Toxiproxy) -> Iterator[Toxiproxy]:
    """The session's toxiproxy-server, with no proxies before and after the test."""
    toxiproxy_server.delete_all()
    yield toxiproxy_server
    toxiproxy_server.delete_all()
