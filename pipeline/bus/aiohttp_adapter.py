"""Every use of aiohttp beyond its documented API in the bus, in one place.

aiohttp documents no way to cap the connections of a server, and documents
``keepalive_timeout`` as the idle time *between* requests only. The bus needs
both bounds on its inbound HTTP (a peer, or anyone who can reach the port,
must not hold unbounded sockets open), so this module relies on two things
that aiohttp 3.14 does but does not promise:

* :class:`aiohttp.web.Server` calls ``connection_made(handler, transport)``
  for each new connection and lists them in ``connections``;
  ``RequestHandler.force_close()`` makes a handler drop its connection.
* ``RequestHandler.connection_made`` starts the keep-alive timer on connect,
  so a connection that never completes a first request is closed after
  ``keepalive_timeout`` too (not only one idle between requests).

tests/integration/bus/test_aiohttp_adapter.py pins both: it fails loudly
(naming this module) when an aiohttp upgrade changes either, and
:data:`TESTED` says which aiohttp minor versions it was checked on. Nothing
else in :mod:`pipeline.bus` may touch a private name of aiohttp.

No speed shortcut lives here: the bus's HTTP in and out use aiohttp's public
API only (the low-level :class:`~aiohttp.web.Server` with a plain handler,
and :class:`aiohttp.ClientSession`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from aiohttp import web

from pipeline.loggate import LogGate

log = logging.getLogger(__name__)

#: aiohttp (major, minor) versions the contract test ran green on.
TESTED = ((3, 14),)


def aiohttp_version() -> tuple[int, int]:
    major, minor = aiohttp.__version__.split(".")[:2]
    return int(major), int(minor)


class BoundedServer(web.Server):
    """aiohttp's low-level server that closes connections past ``max_connections``.

    ``keepalive_timeout`` (aiohttp's own argument) bounds how long a
    connection may go without completing a request, the first one included:
    that last part is aiohttp 3.14 behaviour this module's contract test pins.
    """

    def __init__(self, *args: Any, max_connections: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_connections = max_connections
        self._gate = LogGate(log)  # a flood: one line per interval, with the count

    # Private contract: the hook aiohttp's RequestHandler calls on each connection.
    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self.connections) > self._max_connections:
            self._gate.failed("full", "bus: more than %d HTTP connections; closing new ones",
                              self._max_connections)  # fmt: skip
            handler.force_close()
            transport.close()
