"""Inbound HTTP: the seed's ``POST /zbus-remote`` and ``POST /zbus-reply`` endpoints.

Both take one envelope as the JSON body (the seed's POST), or several as a
batch body (``Content-Type: application/x-sluice-batch``, one envelope per
line, negotiated and laid out as :mod:`pipeline.bus.forward` says; every
response carries ``X-Sluice-Batch: 1``), signed by the sending bus
(``X-Sluice-Twin`` names it, ``X-Sluice-Time`` is its clock in ms,
``X-Sluice-Signature`` is Ed25519 over both, this twin, the path and the exact
body: see :mod:`pipeline.bus.signing`), and answer:

=====  ==========================================================
200    accepted: a request queued to its handler (``msgbus.$cmd``); a reply
       pushed to its caller's ``ret`` (and its backlog entry dropped)
400    the envelope is invalid
401    unsigned (and legacy peers are not allowed), bad signature, or a
       signed time outside the clock window (``replay_window_s``)
403    unknown sender twin, or a reply from a twin the request was not sent to
404    not for this twin, or a reply whose uid is not in the backlog
409    a request uid already seen (replay); the sender counts it as delivered
410    the request expired
503    Redis is unavailable, the seen-uid memory is full, or the POST was signed
       before this twin's replay memory began (it lost its data; see below):
       not acted on, the sender retries (with a fresh signature)
=====  ==========================================================

A batch gets 200 with ``{"results": [[status, "error"], ...]}``, one entry
per envelope in body order with the statuses above; a status other than 200
for a batch is about the whole POST (413 also for more than
:data:`~pipeline.bus.post.MAX_BATCH` envelopes, 400 without
``X-Sluice-Twin``), and every envelope of a batch must have that ``src``.

Replay protection: a signed request is refused unless its signed time is
within ``replay_window_s`` of this bus's clock, and its ``src:uid`` is
remembered until that window has passed (then the clock check refuses a copy),
so a copy of the POST is refused by one check or the other, whatever ``now``
and ``exp`` the client put in the envelope. The memory holds at most
``max_seen`` ids: about (requests per second) x ``replay_window_s``. A
legitimate resend (after the sender restarted) within the window gets 409,
which the sender counts as delivered.

The memory survives its own loss: it has an epoch (``msgbus.system.seen.epoch``,
set when first used), and a POST (request or reply) signed before the epoch
gets 503. A Redis that lost its data (a wipe, a restart without persistence)
lost the epoch with the seen ids, and a missing epoch becomes "now": a copy of
any POST signed before the loss is refused, since nothing proves it was not
seen; the legitimate sender's retry is signed anew and passes. Unsigned
(legacy) POSTs have no signed time to check.

Only the short public text of an error is sent back; details are logged.

Connections are bounded: at most ``max_connections`` at once (more are
closed on arrival), and one that completes no request for ``idle_s`` seconds,
first or next, is closed (aiohttp's keep-alive timer, which it also starts on
connect); a request head is bounded by aiohttp (8190-byte lines, 128 headers),
a body by ``max_size`` (413) and, as the head, by ``idle_s``: a body still
arriving then gets 408 and its connection is closed (no lingering read). Both connection bounds rest on aiohttp behaviour
it does not document: :mod:`pipeline.bus.aiohttp_adapter` holds that, pinned by
a contract test; everything else here is aiohttp's public API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import redis.exceptions
from aiohttp import web

from pipeline import keys
from pipeline.bus import answers, envelope
from pipeline.bus.aiohttp_adapter import BoundedServer
from pipeline.bus.ingress import Ingress
from pipeline.bus.post import BATCH_HEADER, BATCH_TYPE, MAX_BATCH, REMOTE_PATH, REPLY_PATH
from pipeline.bus.signing import SIGNATURE_HEADER, TIME_HEADER, TWIN_HEADER
from pipeline.errors import EnvelopeError, SignatureError
from pipeline.loggate import LogGate

log = logging.getLogger(__name__)


class _Unsigned(float):
    """The "signed time" of a legacy peer's unsigned POST: this bus's clock (no epoch check)."""


def _signed_ms(sent: float) -> str:
    """The signed time for the replay memory's epoch check ('' when unsigned)."""
    return "" if isinstance(sent, _Unsigned) else str(round(sent * 1000))


_OK = b'{"ok":true}'


#: ``(status, error text)`` of one envelope; ``(200, "")`` is accepted.
Verdict = tuple[int, str]
_ACCEPT: Verdict = (200, "")


def _respond(verdict: Verdict) -> web.Response:
    if verdict[0] == 200:
        return web.Response(body=_OK, content_type="application/json")
    return web.json_response({"error": verdict[1]}, status=verdict[0])


async def _authenticate(
    ing: Ingress, request: web.BaseRequest, body: bytes, src: int
) -> float | Verdict:
    """The sender's signed time (epoch s) when the POST is signed by ``src``, else the refusal.

    A legacy peer's unsigned POST (when allowed) gets this bus's own clock.
    """
    header = request.headers.get(TWIN_HEADER)
    if header is not None and header.strip() != str(src):
        return 401, "sender twin does not match src"
    peer = await ing.directory.lookup(src)
    if peer is None:
        return 403, "unknown twin"
    signature = request.headers.get(SIGNATURE_HEADER)
    now = time.time()
    if signature is None:
        if ing.legacy_peers:
            return _Unsigned(now)
        return 401, SignatureError.public_message
    if peer.verifier is None:
        return 401, "no public key for this twin"
    sent = request.headers.get(TIME_HEADER, "")
    if not sent.isdigit() or len(sent) > 15:
        return 401, "missing or invalid signed time"
    sent_ms = int(sent)
    try:
        peer.verifier.verify_post(
            src=src,
            dst=ing.twin,
            path=request.path,
            sent_ms=sent_ms,
            body=body,
            signature=signature,
        )
    except SignatureError:
        log.warning("bus: forged or corrupted signature from twin %s", src)
        return 401, SignatureError.public_message
    if abs(sent_ms / 1000 - now) > ing.replay_window_s:
        log.warning("bus: POST from twin %s signed %.0fs away from now", src, sent_ms / 1000 - now)
        return 401, "signed time outside the clock window"
    return sent_ms / 1000


#: Slow bodies: one line per interval however many peers trickle (each is counted).
_SLOW = LogGate(log)


async def _body(ing: Ingress, request: web.BaseRequest) -> bytes | Verdict:
    """The body, which must arrive within ``idle_s`` as the head must; else the refusal
    (408 for a body that trickled, after which the connection is closed)."""
    try:
        async with asyncio.timeout(ing.idle_s):
            body = await read_body(request, ing.max_size + 4096)
    except TimeoutError:
        ing.counts["slow_bodies"] += 1
        _SLOW.failed("slow", "bus: a request body took over %.0fs to arrive; closed "
                     "(every one is counted in /metrics)", ing.idle_s)  # fmt: skip
        return 408, "request body too slow"
    return (413, "request body too large") if body is None else body


async def read_body(request: web.BaseRequest, limit: int) -> bytes | None:
    """The request body, or None when it is longer than ``limit`` bytes (public API only)."""
    length = request.content_length
    if length is not None:
        if length > limit:
            return None
        return await request.content.readexactly(length) if length else b""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():  # chunked: count as it arrives
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _precheck(ing: Ingress, env: envelope.Envelope, *, reply: bool) -> Verdict | None:
    """The refusal of an envelope that is not for this endpoint of this twin, else None."""
    if env.dst != [ing.twin]:
        return 404, "destination mismatch"
    if not reply and not env.uid:
        return 400, "invalid envelope: uid missing"
    return None


async def _queue_requests(
    ing: Ingress, envs: list[envelope.Envelope], sent: float
) -> list[Verdict]:
    """Queue authenticated requests to their handlers' queues unless expired or replayed.

    All of one POST go to Redis in one step (:meth:`BusStore.accept_requests`),
    straight to ``msgbus.$cmd`` with ``ret`` set to ``msgbus.system.reply``: what the
    seed's ``msgbus.system.remote`` loop would do, one Redis hop sooner.
    """
    early, pending = _unexpired(ing, envs, time.time())
    # Remembered until the clock window refuses a copy (1 s margin for rounding);
    # legacy unsigned peers get this bus's clock as their signed time.
    forget_at = sent + ing.replay_window_s + 1
    try:
        results = await ing.store.accept_requests(pending, forget_at, _signed_ms(sent))
        ing.redis_works()
    except (redis.exceptions.RedisError, OSError) as exc:
        ing.redis_failed(exc)
        results = [3] * len(pending)
    queued = (env for env, verdict in zip(envs, early, strict=True) if verdict is None)
    outcomes = iter(zip(results, queued, strict=True))
    out: list[Verdict] = []
    refusals: list[bytes] = []
    for verdict in early:
        if verdict is None:
            result, env = next(outcomes)
            verdict = _accepted(ing, result, env, refusals)
        out.append(verdict)
    await _queue_refusals(ing, refusals)
    return out


def _unexpired(
    ing: Ingress, envs: list[envelope.Envelope], now: float
) -> tuple[list[Verdict | None], list[tuple[str, str, bytes]]]:
    """410 for each expired request (None for the others), and the others as
    ``(seen id, handler queue, body)`` for :meth:`BusStore.accept_requests`."""
    verdicts: list[Verdict | None] = []
    pending: list[tuple[str, str, bytes]] = []
    for env in envs:
        expires = envelope.deadline(
            env, received=now, default_exp=ing.default_exp, max_exp=ing.max_exp
        )
        if expires <= now:
            verdicts.append((410, "request expired"))
            continue
        verdicts.append(None)
        body = env.encode(ret=keys.BUS_REPLY)
        pending.append((f"{env.src}:{env.uid}", keys.bus_command(env.cmd), body))
    return verdicts, pending


def _accepted(ing: Ingress, result: int, env: envelope.Envelope, refusals: list[bytes]) -> Verdict:
    """The verdict on one request from its :meth:`BusStore.accept_requests` result
    (3: Redis failed); a request set aside adds its caller's refusal to ``refusals``."""
    if result in (1, 2):
        if result == 2:
            # The handler's queue is not a list (the request is in the dead-letter
            # list): its caller hears it now, through the reply queue, not at expiry.
            log.error("bus: msgbus.%s is not a list; request %s refused", env.cmd, env.uid)
            text = f"command queue of {env.cmd} unavailable"
            refusals.append(answers.refusal(env, text, me=ing.twin).encode())
        return _ACCEPT
    if result == 0:
        log.warning("bus: replayed request %s from twin %s refused", env.uid, env.src)
        return 409, "replayed request"
    if result == STALE:
        return _stale(env)
    if result < 0:
        log.error("bus: seen-uid memory full (%d); refusing for now", ing.store.max_seen)
        return 503, "busy"
    return 503, "redis unavailable"


#: A store result: signed before the replay memory's epoch (see ``scripts.STALE``).
STALE = -2


def _stale(env: envelope.Envelope) -> Verdict:
    """503 for a POST signed before this twin's replay memory began (it lost its data):
    nothing proves it was not seen before, so it is not acted on. A legitimate sender
    retries (503 means "not acted on") with a fresh signature, which passes."""
    log.warning(
        "bus: %s from twin %s signed before the replay memory began; refused",
        env.uid, env.src,
    )  # fmt: skip
    return 503, "signed before this twin's replay memory began; sign it again"


async def _queue_refusals(ing: Ingress, refusals: list[bytes]) -> None:
    """Push the refusals to the reply queue; on a Redis failure their callers hear at expiry."""
    if not refusals:
        return
    try:
        await ing.store.redis.rpush(keys.BUS_REPLY, *refusals)
    except (redis.exceptions.RedisError, OSError):
        log.exception("bus: refusals not queued; their callers hear at expiry")


async def _deliver_replies(
    ing: Ingress, envs: list[envelope.Envelope], sent: float
) -> list[Verdict]:
    """Answer the callers of authenticated replies (all of one POST in one Lua step)."""
    try:
        results = await ing.store.deliver_replies(
            [(env.uid, env.src, *answers.answer_parts(env)) for env in envs], _signed_ms(sent)
        )
        ing.redis_works()
    except (redis.exceptions.RedisError, OSError) as exc:
        ing.redis_failed(exc)
        return [(503, "redis unavailable")] * len(envs)
    out: list[Verdict] = []
    matched: list[str] = []
    for env, result in zip(envs, results, strict=True):
        if result == STALE:
            out.append(_stale(env))
        elif result == 0:
            log.warning("bus: reply %s from twin %s matches no request", env.uid, env.src)
            out.append((404, "unknown uid"))
        elif result < 0:
            log.warning("bus: reply %s from twin %s: request went elsewhere", env.uid, env.src)
            out.append((403, "reply from the wrong twin"))
        else:
            out.append(_ACCEPT)
            matched.append(env.uid)
            ing.counts["handler_failed" if env.err else "answered"] += 1
    if matched and ing.answered is not None:
        ing.answered(matched)  # their pending retries are not sent again
    return out


#: Takes the authenticated envelopes of one POST: their verdicts, in order.
_Take = Callable[[Ingress, list[envelope.Envelope], float], Awaitable[list[Verdict]]]


async def _single(ing: Ingress, request: web.BaseRequest, take: _Take, *, reply: bool) -> Verdict:
    """The seed's POST: one envelope as the JSON body."""
    body = await _body(ing, request)
    if isinstance(body, tuple):
        return body
    try:
        env = envelope.decode(body, reply=reply, max_size=ing.max_size)
    except EnvelopeError as exc:
        return 400, exc.public_message
    refused = _precheck(ing, env, reply=reply)
    if refused is not None:
        return refused
    sent = await _authenticate(ing, request, body, env.src)
    if not isinstance(sent, float):
        return sent
    [verdict] = await take(ing, [env], sent)
    return verdict


async def _batch(
    ing: Ingress, request: web.BaseRequest, take: _Take, *, reply: bool
) -> web.Response:
    """Several envelopes, one per line, under one signature (see :mod:`pipeline.bus.forward`)."""
    body = await _body(ing, request)
    if isinstance(body, tuple):
        return _respond(body)
    src_text = request.headers.get(TWIN_HEADER, "").strip()
    if not src_text.isdigit() or len(src_text) > 12:
        return _respond((400, f"a batch needs {TWIN_HEADER}"))
    lines = body.split(b"\n")
    if len(lines) > MAX_BATCH:
        return _respond((413, f"more than {MAX_BATCH} envelopes"))
    src = int(src_text)
    sent = await _authenticate(ing, request, body, src)
    if not isinstance(sent, float):
        return _respond(sent)

    judged: list[Verdict | envelope.Envelope] = []
    for line in lines:
        try:
            env = envelope.decode(line, reply=reply, max_size=ing.max_size)
        except EnvelopeError as exc:
            judged.append((400, exc.public_message))
            continue
        refused = (401, "sender twin does not match src") if env.src != src else None
        refused = refused or _precheck(ing, env, reply=reply)
        judged.append(env if refused is None else refused)
    taken = iter(await take(ing, [e for e in judged if isinstance(e, envelope.Envelope)], sent))
    verdicts = [next(taken) if isinstance(e, envelope.Envelope) else e for e in judged]
    return web.json_response({"results": [list(verdict) for verdict in verdicts]})


def build_server(ing: Ingress) -> web.Server:
    """aiohttp's low-level server (no router, no middlewares: less work per request)."""
    routes: dict[str, tuple[_Take, bool]] = {
        REMOTE_PATH: (_queue_requests, False),
        REPLY_PATH: (_deliver_replies, True),
    }

    async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
        route = routes.get(request.path)
        if route is None:
            response = _respond((404, "not found"))
        elif request.method != "POST":
            response = _respond((405, "method not allowed"))
        elif request.content_type == BATCH_TYPE:
            response = await _batch(ing, request, route[0], reply=route[1])
        else:
            response = _respond(await _single(ing, request, route[0], reply=route[1]))
        response.headers[BATCH_HEADER] = "1"  # this bus takes batch bodies
        return response

    # lingering_time=0: a body left unread (too slow, too large) ends its connection at
    # once, instead of aiohttp reading and dropping it for 10 more seconds
    return BoundedServer(
        dispatch,
        max_connections=ing.max_connections,
        keepalive_timeout=ing.idle_s,
        lingering_time=0,
    )
