"""Outbound HTTP: POST one envelope per request to a peer's ``/zbus-remote`` or ``/zbus-reply``.

Every outbound item is first written to the Redis outbox (by the loop that
created it) and leaves it only when the POST succeeded or failed for good, so
a restart resends whatever was pending. Sending is concurrent (a fixed set of
workers over one pooled :class:`aiohttp.ClientSession`); a failed attempt is
retried with doubling, capped backoff from a delay heap, without holding a
worker, until its ``try`` budget or its deadline runs out. A bounded number of
items is in memory at once: :meth:`Forwarder.submit` waits for room.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum

import aiohttp

from pipeline.bus.directory import Directory
from pipeline.bus.httpclient import HttpPool
from pipeline.bus.signing import SIGNATURE_HEADER, TIME_HEADER, TWIN_HEADER, Signer

log = logging.getLogger(__name__)

REMOTE_PATH = "/zbus-remote"
REPLY_PATH = "/zbus-reply"


class Kind(StrEnum):
    REQUEST = "remote"
    REPLY = "reply"


class Outcome(Enum):
    DELIVERED = "delivered"
    REFUSED = "refused"  # the peer said no: final
    UNREACHABLE = "unreachable"  # retries or time ran out


@dataclass(order=True, slots=True)
class Outbound:
    """One envelope to POST. ``id`` is its outbox field."""

    due: float
    id: str = field(compare=False)
    kind: Kind = field(compare=False)
    to: int = field(compare=False)
    body: bytes = field(compare=False)
    deadline: float = field(compare=False)
    tries: int = field(compare=False)
    uid: str = field(compare=False)
    resent: bool = field(default=False, compare=False)
    attempt: int = field(default=0, compare=False)
    last_error: str = field(default="", compare=False)
    #: Signature of the POST, made on the first attempt and reused by retries until stale.
    signature: str = field(default="", compare=False)
    #: The signed time (ms) of ``signature``.
    signed_ms: int = field(default=0, compare=False)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "kind": self.kind.value,
                "to": self.to,
                "body": self.body.decode(),
                "deadline": self.deadline,
                "tries": self.tries,
                "uid": self.uid,
            }
        ).encode()

    @classmethod
    def from_json(cls, outbox_id: str, raw: bytes) -> Outbound:
        doc = json.loads(raw)
        return cls(
            due=0.0,
            id=outbox_id,
            kind=Kind(doc["kind"]),
            to=int(doc["to"]),
            body=str(doc["body"]).encode(),
            deadline=float(doc["deadline"]),
            tries=int(doc["tries"]),
            uid=str(doc["uid"]),
            resent=True,
        )


#: Called once per item with its final outcome (and error text when not delivered).
Done = Callable[[Outbound, Outcome, str], Awaitable[None]]


class Forwarder:
    def __init__(
        self,
        *,
        twin: int,
        directory: Directory,
        signer: Signer | None,
        done: Done,
        workers: int = 128,
        max_pending: int = 10_000,
        retry_base_s: float = 0.1,
        retry_max_s: float = 2.0,
        request_timeout_s: float = 10.0,
        resign_after_s: float = 75.0,
    ) -> None:
        self.twin = twin
        self._directory = directory
        self._signer = signer
        self._done = done
        self._workers = workers
        self._room = asyncio.Semaphore(max_pending)
        self._ready: asyncio.Queue[Outbound] = asyncio.Queue(maxsize=workers * 4)
        self._delayed: list[Outbound] = []
        self._wake = asyncio.Event()
        self._base = retry_base_s
        self._cap = retry_max_s
        self._resign_ms = int(resign_after_s * 1000)
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, connect=2.0)
        self._session: aiohttp.ClientSession | None = None  # https:// peers
        self._pool = HttpPool(per_host=workers, deadline_s=request_timeout_s)  # http:// peers
        self.sent = 0
        self.retried = 0

    async def run(self) -> None:
        """Send until cancelled. Owns its session and worker tasks."""
        connector = aiohttp.TCPConnector(limit=self._workers, limit_per_host=self._workers)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session:
            self._session = session
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._scheduler())
                    for _ in range(self._workers):
                        group.create_task(self._worker())
            finally:
                self._pool.close()

    async def submit(self, item: Outbound) -> None:
        """Hand over one item (already in the outbox); waits while too many are pending."""
        await self._room.acquire()
        await self._ready.put(item)

    def backoff(self, attempt: int) -> float:
        return float(min(self._cap, self._base * (2 ** min(attempt, 30))))

    async def _scheduler(self) -> None:
        while True:
            now = time.time()
            while self._delayed and self._delayed[0].due <= now:
                await self._ready.put(heapq.heappop(self._delayed))
            wait = self._delayed[0].due - now if self._delayed else 1.0
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, min(wait, 1.0)))
            except TimeoutError:
                pass

    async def _worker(self) -> None:
        while True:
            item = await self._ready.get()
            try:
                outcome, text = await self._attempt(item)
            except Exception:  # the boundary: one item (or a directory outage) never ends a worker
                log.exception("bus: sending %s failed", item.id)
                outcome, text = Outcome.UNREACHABLE, "remote unreachable: internal error"
            if outcome is Outcome.UNREACHABLE:
                pause = self.backoff(item.attempt)
                item.attempt += 1
                item.last_error = text
                if item.attempt <= item.tries and time.time() + pause < item.deadline:
                    self.retried += 1
                    item.due = time.time() + pause
                    heapq.heappush(self._delayed, item)
                    self._wake.set()
                    continue
            self._room.release()
            try:
                await self._done(item, outcome, text)
            except Exception:  # the boundary: the item stays in the backlog / outbox
                log.exception("bus: recording the outcome of %s failed", item.id)

    async def _attempt(self, item: Outbound) -> tuple[Outcome, str]:
        if time.time() >= item.deadline:
            return Outcome.REFUSED, "request expired"
        peer = await self._directory.lookup(item.to)
        if peer is None:
            return Outcome.REFUSED, "destination not found"
        path = REMOTE_PATH if item.kind is Kind.REQUEST else REPLY_PATH
        headers = {TWIN_HEADER: str(self.twin), "Content-Type": "application/json"}
        if self._signer is not None:
            now_ms = int(time.time() * 1000)
            if not item.signature or now_ms - item.signed_ms > self._resign_ms:
                # Retries reuse a signature until it nears the receiver's clock window.
                item.signed_ms = now_ms
                item.signature = self._signer.sign_post(
                    src=self.twin, dst=item.to, path=path, sent_ms=now_ms, body=item.body
                )
            headers[TIME_HEADER] = str(item.signed_ms)
            headers[SIGNATURE_HEADER] = item.signature
        try:
            if peer.url.startswith("http://"):
                status, raw = await self._pool.post(peer.url + path, item.body, headers)
                text = raw[:200].decode("utf-8", "replace")
            else:
                assert self._session is not None
                async with self._session.post(
                    peer.url + path, data=item.body, headers=headers
                ) as resp:
                    text = (await resp.text())[:200]
                    status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return Outcome.UNREACHABLE, f"remote unreachable: {type(exc).__name__}"
        self.sent += 1
        if status == 200:
            return Outcome.DELIVERED, ""
        if status == 409 and (item.resent or item.attempt > 0):
            return Outcome.DELIVERED, ""  # an earlier attempt got through
        if status >= 500:
            return Outcome.UNREACHABLE, f"remote unavailable: HTTP {status}"
        if status == 410:
            return Outcome.REFUSED, "request expired"
        return Outcome.REFUSED, f"remote refused: {_error_text(text) or status}"


def _error_text(body: str) -> str:
    """The ``error`` of a peer's JSON refusal, else its (truncated) body."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    return str(doc.get("error", body)) if isinstance(doc, dict) else body
