"""One POST to a peer: its wire names, body and signature, the exchange, the answer judged.

The steps :meth:`pipeline.bus.forward.Forwarder._send` takes, each on its own:
:func:`mark_answered` and :func:`expired` (what no longer goes), :func:`resolve` (where the peer is),
:func:`prepare` (the body, one envelope or a batch, and its signed headers),
:func:`exchange` (the HTTP round trip, its answer read within a bound) and
:func:`judge_answer` (each item's :class:`~pipeline.bus.outbound.Outcome`). A POST
that got no answer raises :class:`~pipeline.errors.PostUnanswered`, which says what became of its items.
The batch body and its negotiation are described in :mod:`pipeline.bus.forward`.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from pipeline.bus.config import REDIS_ERRORS, reraise_if_cancelling
from pipeline.bus.directory import Directory, Peer
from pipeline.bus.outbound import Judged, Kind, Outbound, Outcome
from pipeline.bus.signing import SIGNATURE_HEADER, TIME_HEADER, TWIN_HEADER, Signer
from pipeline.errors import PostUnanswered

REMOTE_PATH = "/zbus-remote"
REPLY_PATH = "/zbus-reply"
#: Response header of a bus that takes batch bodies.
BATCH_HEADER = "X-Sluice-Batch"
#: Content type of a batch body: envelopes, one per line.
BATCH_TYPE = "application/x-sluice-batch"
#: Most envelopes in one batch body (a receiver refuses more with 413).
MAX_BATCH = 512
#: Most bytes of a peer's response read (a batch's results fit with room to spare).
MAX_RESPONSE = 1 << 20
#: Statuses of a refused batch that mean "send single envelopes".
NO_BATCH = frozenset({400, 404, 405, 413, 415})
#: Bodies larger than this go to aiohttp as a file object (see exchange()).
_LARGE_BODY = 1 << 20


@dataclass(frozen=True, slots=True)
class Answer:
    """A peer's answer to one POST: its status, whether it takes batches, its body."""

    status: int
    batching: bool
    body: bytes


def unanswered(exc: PostUnanswered) -> Judged:
    """The outcome of every item of a POST that got no answer."""
    return (Outcome.UNKNOWN if exc.reached else Outcome.UNREACHABLE, str(exc))


def path_of(kind: Kind) -> str:
    """The peer's endpoint for ``kind``."""
    return REMOTE_PATH if kind is Kind.REQUEST else REPLY_PATH


#: Whether each request (by uid) is still in the backlog: its caller not answered yet.
Pending = Callable[[list[str]], Awaitable[list[bool]]]


async def mark_answered(items: list[Outbound], pending: Pending | None) -> None:
    """Mark :attr:`Outbound.answered` the requests sent before (a retry, a resend) whose
    backlog entry is gone: their reply came, perhaps to the twin's other bus (a standby
    takes POSTs too), so no copy goes (see :func:`expired`). One Redis read per POST
    carrying such a request; when Redis fails, they go."""
    again = [i for i in items if i.kind is Kind.REQUEST and (i.attempt or i.resent)]
    again = [item for item in again if not item.answered]
    if pending is None or not again:
        return
    try:
        found = await pending([item.uid for item in again])
    except REDIS_ERRORS as exc:
        reraise_if_cancelling(exc)
        return
    for item, still in zip(again, found, strict=True):
        item.answered = not still


def expired(items: list[Outbound], now: float) -> list[Judged | None]:
    """The outcome of each item settled before its POST; None for those still to send.

    Delivered for a request whose reply came meanwhile (:attr:`Outbound.answered`: no
    copy goes out after its caller had the answer); past its deadline, ``request
    expired`` for one never sent, and one that expired while it waited to be sent again
    keeps what its attempts said (unreachable, or maybe delivered: unknown).
    """
    return [_settled(item, now) for item in items]


def _settled(item: Outbound, now: float) -> Judged | None:
    if item.answered:
        return Outcome.DELIVERED, ""
    return None if now < item.deadline else _expired(item)


def _expired(item: Outbound) -> Judged:
    if item.attempt == 0:
        return Outcome.EXPIRED, "request expired"
    return (Outcome.UNKNOWN if item.maybe_delivered else Outcome.UNREACHABLE), item.last_error


def merge(early: list[Judged | None], answers: list[Judged]) -> list[Judged]:
    """``early``'s outcomes, each gap filled in order from ``answers`` (one per gap)."""
    rest = iter(answers)
    return [result or next(rest) for result in early]


async def resolve(directory: Directory, to: int) -> Peer | None:
    """Where twin ``to`` listens (None: not in the directory); :class:`~pipeline.errors.PostUnanswered` when
    the directory itself fails (nothing was sent)."""
    try:
        return await directory.lookup(to)
    except Exception as exc:  # noqa: BLE001 - any directory failure: nothing was sent
        text = f"directory lookup failed: {type(exc).__name__}"
        raise PostUnanswered(text, reached=False) from exc


def prepare(
    live: list[Outbound], *, src: int, dst: int, path: str, signer: Signer | None
) -> tuple[bytes, dict[str, str]]:
    """The body of one POST and its headers: one envelope as the seed sends it, or
    several as one batch body; signed with this bus's time when it has a key."""
    if len(live) > 1:
        body, content_type = b"\n".join(item.body for item in live), BATCH_TYPE
    else:
        body, content_type = live[0].body, "application/json"
    headers = {TWIN_HEADER: str(src), "Content-Type": content_type}
    if signer is not None:
        sent_ms = int(time.time() * 1000)
        headers[TIME_HEADER] = str(sent_ms)
        headers[SIGNATURE_HEADER] = signer.sign_post(
            src=src, dst=dst, path=path, sent_ms=sent_ms, body=body
        )
    return body, headers


async def exchange(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> Answer:
    """POST ``body`` to ``url`` and read the answer; :class:`~pipeline.errors.PostUnanswered` when none came.

    A POST that never connected is ``UNREACHABLE`` (the peer cannot have acted on
    it); one that connected and then got no whole answer is ``UNKNOWN``.
    """
    # aiohttp warns (ResourceWarning) about a bytes body over 1 MiB; a file object
    # is its way to send one, written in chunks.
    data = body if len(body) <= _LARGE_BODY else io.BytesIO(body)
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            status = resp.status
            batching = resp.headers.get(BATCH_HEADER) == "1"
            raw = await _read_bounded(resp.content, MAX_RESPONSE)
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise PostUnanswered(f"cannot connect: {type(exc).__name__}", reached=False) from exc
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        # Connected, then no (whole) answer: the peer may have taken the POST.
        raise PostUnanswered(f"no answer: {type(exc).__name__}", reached=True) from exc
    return Answer(status, batching, raw)


def judge_answer(live: list[Outbound], answer: Answer) -> list[Judged]:
    """Each item's outcome (in order) from the peer's answer to their POST."""
    if len(live) > 1 and answer.status == 200:
        judged = _batch_results(answer.body, len(live))
        if judged is None:
            bad = (Outcome.UNKNOWN, "remote answered a batch without its results")
            return [bad] * len(live)
        return [_judge(item, code, text) for item, (code, text) in zip(live, judged, strict=True)]
    text = answer.body[:200].decode("utf-8", "replace")
    return [_judge(item, answer.status, text) for item in live]


def _judge(item: Outbound, status: int, text: str) -> tuple[Outcome, str]:
    if status == 200:
        return Outcome.DELIVERED, ""
    if status == 409 and (item.resent or item.attempt > 0):
        return Outcome.DELIVERED, ""  # an earlier attempt got through
    if status == 503:  # a bus that could not take it (redis down, busy): not acted on
        return Outcome.UNREACHABLE, f"remote unavailable: HTTP {status}"
    if status >= 500:  # a proxy's 502/504, a crash: the peer may have acted on it
        return Outcome.UNKNOWN, f"remote failed: HTTP {status}"
    if status == 410:
        return Outcome.EXPIRED, "request expired"
    return Outcome.REFUSED, f"remote refused: {_error_text(text) or status}"


def _batch_results(raw: bytes, count: int) -> list[tuple[int, str]] | None:
    """``[(status, error), ...]`` of a batch response, or None when it is not one for ``count``."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list) or len(results) != count:
        return None
    out: list[tuple[int, str]] = []
    for entry in results:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or type(entry[0]) is not int
            or not isinstance(entry[1], str)
        ):
            return None
        out.append((entry[0], entry[1][:200]))
    return out


async def _read_bounded(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """Up to ``limit`` bytes of a response body; raises ValueError past that."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.readany():
        size += len(chunk)
        if size > limit:
            raise ValueError("response body too large")
        chunks.append(chunk)
    return b"".join(chunks)


def _error_text(body: str) -> str:
    """The ``error`` of a peer's JSON refusal, else its (truncated) body."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    return str(doc.get("error", body)) if isinstance(doc, dict) else body
