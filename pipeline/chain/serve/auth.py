"""The serve token (``SLUICE_SERVE_TOKEN``): what ``sluice serve`` hands out with and without it.

With no token set everything is open (one machine, a private network). With
a token set:

==========================  ===========  =============================================
path                        token        why
==========================  ===========  =============================================
``/ws``, ``/cardinal``      required     the data itself
``/status.json``            required     heads, subscribers, coverage, the hot window
``/metrics``                required     Prometheus sends it (``authorization`` in
                                         the scrape config)
``/``, ``/static/*``        open         the page's shell holds no data; it passes the
                                         ``?token=`` of its own URL on to
                                         ``/status.json`` and says when one is missing
``/healthz``                open         liveness/readiness probes carry no secrets
==========================  ===========  =============================================

A request proves it with ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``
(browsers and websocket clients that cannot set headers). The comparison is
constant-time. A refusal is ``401`` with ``WWW-Authenticate: Bearer`` and a
one-line JSON error; callers count refusals where they keep metrics.
"""

from __future__ import annotations

import hmac

from aiohttp import web

#: The body of every refusal.
REFUSAL = {"error": "missing or invalid bearer token"}


def authorized(request: web.Request, token: str) -> bool:
    """True when no token is set, or the request carries it (header first, then ``?token=``)."""
    if not token:
        return True
    header = request.headers.get("Authorization", "")
    given = header[7:] if header.startswith("Bearer ") else request.query.get("token", "")
    return hmac.compare_digest(given.encode(), token.encode())


def refusal() -> web.Response:
    """``401`` with a Bearer challenge (what a request without the token gets)."""
    return web.json_response(
        REFUSAL,
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="sluice"', "Cache-Control": "no-store"},
    )
