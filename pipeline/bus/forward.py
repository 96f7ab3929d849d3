"""Outbound HTTP: POST envelopes to a peer's ``/zbus-remote`` or ``/zbus-reply``.

Every outbound item is first written to the Redis outbox (by the loop that
created it) and leaves it only when the POST succeeded or failed for good, so
a restart resends whatever was pending. One HTTP client stack: aiohttp's
:class:`aiohttp.ClientSession` (pooled keep-alive connections), for ``http://``
and ``https://`` peers alike.

Coalescing: items wait in one lane per (peer, endpoint). While a POST to a
batching peer is in flight, what arrives waits and goes out together in the
next POST, as one batch body (up to :data:`~pipeline.bus.post.MAX_BATCH`
envelopes and the peer's body limit), with ONE signature over the whole body
and this bus's time (see :mod:`pipeline.bus.signing`); a second POST (up to
``lane_posts`` in flight) leaves only with a full batch, so a busy lane sends
few large POSTs (each POST costs both buses the same CPU however many
envelopes it carries) and a lane with more than one full batch waiting still
sends several at once. A failed item is retried with doubling, capped backoff
from a delay heap, until its ``try`` budget or its deadline runs out. A peer
whose last POST got no answer is *down*: one POST at a time goes to it (a probe
with what waits), spaced by a doubling, capped, jittered delay (a connection
attempt a second or two, not one per item); all goes once a probe is answered. A
bounded number of items is in memory at once: :meth:`Forwarder.submit` waits
for room.

Batch body negotiation (the seed's single-envelope POST stays the default)
--------------------------------------------------------------------------
* A bus that takes batches says so on every response of both endpoints:
  ``X-Sluice-Batch: 1`` (:data:`~pipeline.bus.post.BATCH_HEADER`).
* A sender POSTs single envelopes (the seed's ``application/json`` body) to a
  peer until a response from it carried that header; then, whenever two or
  more envelopes are waiting for that peer, it POSTs them as one
  ``Content-Type: application/x-sluice-batch``
  (:data:`~pipeline.bus.post.BATCH_TYPE`) body: the envelopes' compact JSON,
  one per line, joined by ``\n`` (an envelope whose encoding holds a raw
  newline goes alone). ``X-Sluice-Twin`` is required on a batch.
* The receiver checks the one signature, then judges each envelope as if it
  had come alone, and answers ``200`` with ``{"results": [[status, "error"],
  ...]}`` in body order (the statuses of the single-envelope table in
  :mod:`pipeline.bus.http`). A status other than 200 for the whole POST is
  about the whole POST (401 bad signature, 403 unknown twin, 413 too big, 503).
* A peer that answers a batch with 400, 404, 405, 413 or 415 (a seed peer that
  does not know the type, or a smaller body limit) is sent single envelopes
  again for :data:`SINGLE_FOR_S` seconds; the batch's items are resent singly
  without spending a try.

The items and their outcomes are :mod:`pipeline.bus.outbound`; one POST's
steps (the body, its signature, the exchange, the answer judged) are
:mod:`pipeline.bus.post`; this module decides when and what to send.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from collections.abc import Iterable

import aiohttp

from pipeline.bus import post
from pipeline.bus.directory import Directory
from pipeline.bus.outbound import (
    UNKNOWN_TEXT,
    UNREACHABLE_TEXT,
    Done,
    Final,
    Judged,
    Kind,
    Outbound,
    Outcome,
)
from pipeline.bus.peers import PeerBook
from pipeline.bus.post import MAX_BATCH
from pipeline.bus.signing import Signer
from pipeline.errors import PostUnanswered
from pipeline.loggate import LogGate

log = logging.getLogger(__name__)

#: Seconds a peer that refused a batch is sent single envelopes before trying again.
SINGLE_FOR_S = 300.0
#: Seconds between log lines of one failure class (a dead peer fails every request).
LOG_EVERY_S = 10.0


class _Lane:
    """Items waiting for one (peer, endpoint), and the POSTs in flight to it."""

    __slots__ = ("inflight", "queue", "queued_bytes", "scheduled", "timer")

    def __init__(self) -> None:
        self.queue: deque[Outbound] = deque()
        self.queued_bytes = 0  # body bytes in the queue
        self.inflight = 0
        self.scheduled = False
        #: Wakes the lane when its down peer's next probe is due.
        self.timer: asyncio.TimerHandle | None = None

    def may_post(self, limit: int, full_bytes: int) -> bool:
        """Whether to send a batch now: none in flight, or a full batch waiting (and room)."""
        if not self.queue or self.inflight >= limit:
            return False
        return self.inflight == 0 or len(self.queue) >= MAX_BATCH or self.queued_bytes >= full_bytes


class Forwarder:
    def __init__(
        self,
        *,
        twin: int,
        directory: Directory,
        signer: Signer | None,
        done: Done,
        workers: int = 128,
        lane_posts: int = 4,
        max_pending: int = 10_000,
        max_batch_bytes: int = 1 << 20,
        retry_base_s: float = 0.1,
        retry_max_s: float = 2.0,
        request_timeout_s: float = 10.0,
        pending: post.Pending | None = None,
    ) -> None:
        self.twin = twin
        self._directory = directory
        self._signer = signer
        self._done = done
        self._workers = workers
        self._lane_posts = lane_posts
        self._max_batch_bytes = max_batch_bytes
        self._room = asyncio.Semaphore(max_pending)
        self._lanes: dict[tuple[int, Kind], _Lane] = {}
        self._delayed: list[Outbound] = []
        self._wake = asyncio.Event()
        self._cap = retry_max_s
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, connect=2.0)
        self._session: aiohttp.ClientSession | None = None
        self._group: asyncio.TaskGroup | None = None
        #: Peers that advertised batches; peers that refused one (until when).
        self._batching: set[int] = set()
        self._single_until: dict[int, float] = {}
        self.sent = 0  # envelopes that got an answer
        self.posts = 0  # POSTs that got an answer
        self.retried = 0
        #: Final outcomes by (kind, outcome value), e.g. ("remote", "unreachable").
        self.outcomes: dict[tuple[str, str], int] = {}
        #: Whether each peer answers; when the next POST may go to one that does not.
        self.peers = PeerBook(base_s=retry_base_s, cap_s=retry_max_s)
        self._gate = LogGate(log, LOG_EVERY_S)
        #: Requests handed over and not settled yet, by uid (see :meth:`answered`).
        self._held: dict[str, Outbound] = {}
        self._pending = pending

    async def run(self) -> None:
        """Send until cancelled. Owns its session and POST tasks."""
        connector = aiohttp.TCPConnector(limit=self._workers, limit_per_host=self._workers)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session:
            self._session = session
            try:
                async with asyncio.TaskGroup() as group:
                    self._group = group
                    group.create_task(self._scheduler())
                    for key in list(self._lanes):  # submitted before the group existed
                        self._schedule(key)
            finally:
                self._group = None  # stopped: what is queued stays in the outbox / backlog

    async def submit(self, item: Outbound) -> None:
        """Hand over one item (already in the outbox); waits while too many are pending."""
        await self._room.acquire()
        if item.kind is Kind.REQUEST:
            self._held[item.uid] = item
        self._enqueue(item)

    def answered(self, uids: Iterable[str]) -> None:
        """The replies of these requests came: what of them waits (a retry, a resend)
        is settled as delivered and never sent again, so no copy reaches the peer after
        its caller had the answer (a peer that lost its seen uids would run it again)."""
        for uid in uids:
            item = self._held.pop(uid, None)
            if item is not None:
                item.answered = True

    def unreachable(self) -> dict[int, float]:
        """Peers that answer no POST now, and for how long (see :class:`PeerBook`)."""
        return self.peers.unreachable()

    def backoff(self, attempt: int) -> float:
        return self.peers.backoff(attempt)

    def batches_to(self, twin: int) -> bool:
        """Whether POSTs to ``twin`` may carry several envelopes (see the module docstring)."""
        if twin not in self._batching:
            return False
        until = self._single_until.get(twin)
        if until is None:
            return True
        if time.time() < until:
            return False
        del self._single_until[twin]
        return True

    # --- lanes ---------------------------------------------------------------

    def _enqueue(self, item: Outbound) -> None:
        key = (item.to, item.kind)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        lane.queue.append(item)
        lane.queued_bytes += len(item.body)
        self._schedule(key)

    def _schedule(self, key: tuple[int, Kind]) -> None:
        """Pump ``key``'s lane on the next loop turn: items submitted in this turn share a POST."""
        lane = self._lanes.get(key)
        if lane is not None and not lane.scheduled:
            lane.scheduled = True
            asyncio.get_running_loop().call_soon(self._pump, key)

    def _pump(self, key: tuple[int, Kind]) -> None:
        lane = self._lanes.get(key)
        if lane is None:
            return
        lane.scheduled = False
        batch = self.batches_to(key[0])
        limit = self._lane_posts if batch else self._workers
        wait = self.peers.wait_s(key[0])
        if wait is not None:  # a peer that answers nothing: one probe at a time, when due
            if wait > 0 and lane.queue and lane.timer is None:
                lane.timer = asyncio.get_running_loop().call_later(wait, self._wake_lane, key)
            if wait > 0 or lane.inflight:
                return
            limit = 1
        # single envelopes (a peer that takes no batches) go as soon as there is room
        while lane.queue and (
            lane.may_post(limit, self._max_batch_bytes) if batch else lane.inflight < limit
        ):
            items = self._take(lane, batch)
            if not self._start_post(key, lane, items):
                # not running (yet), or stopping: nothing can be sent; it stays queued
                lane.queue.extendleft(reversed(items))
                lane.queued_bytes += sum(len(item.body) for item in items)
                return
        if not lane.queue and not lane.inflight:
            del self._lanes[key]

    def _wake_lane(self, key: tuple[int, Kind]) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.timer = None
            self._schedule(key)

    def _start_post(self, key: tuple[int, Kind], lane: _Lane, items: list[Outbound]) -> bool:
        """Start one POST task; False when the sender is not running or is stopping."""
        if self._group is None:
            return False
        post = self._post(key, lane, items)
        try:
            self._group.create_task(post)
        except RuntimeError:  # the task group is shutting down (run() was cancelled)
            post.close()
            return False
        lane.inflight += 1
        return True

    def _take(self, lane: _Lane, batch: bool) -> list[Outbound]:
        items = self._frame(lane, batch)
        lane.queued_bytes -= sum(len(item.body) for item in items)
        return items

    def _frame(self, lane: _Lane, batch: bool) -> list[Outbound]:
        first = lane.queue.popleft()
        items = [first]
        if not batch or b"\n" in first.body:
            return items
        size = len(first.body)
        while lane.queue and len(items) < MAX_BATCH:
            body = lane.queue[0].body
            size += len(body) + 1
            if b"\n" in body or size > self._max_batch_bytes:
                break
            items.append(lane.queue.popleft())
        return items

    async def _post(self, key: tuple[int, Kind], lane: _Lane, items: list[Outbound]) -> None:
        try:
            sent = await self._send(key[0], key[1], items)
        except Exception:  # the boundary: one POST (or a directory outage) never ends sending
            log.exception("bus: sending %d item(s) to twin %s failed", len(items), key[0])
            failed = [(Outcome.UNKNOWN, "internal error")] * len(items)
            sent = failed, failed
        finally:
            lane.inflight -= 1
        self._schedule(key)  # what waited behind this POST goes now, not after _record
        if sent is None:  # not as a batch: again, singly, no try spent
            for item in items:
                self._enqueue(item)
        else:
            outcomes, heard = sent
            self._note_peer(key[0], heard)
            finals: list[Final] = []
            for item, out in zip(items, outcomes, strict=True):
                final = self._settle(item, *out)
                if final is not None:
                    finals.append((item, *final))
                    self._count(item, final)
            if finals:
                await self._record(finals)

    def _settle(self, item: Outbound, outcome: Outcome, text: str) -> Judged | None:
        """The final outcome of ``item``, or None when it was scheduled for a retry.

        A request that did not reach its peer is retried with capped backoff
        until its own deadline (its ``try`` budget only sets how many quick
        retries come first: a short outage must not fail requests that still
        have minutes to live). The final failure says whether any attempt may
        have reached the peer (:data:`UNKNOWN_TEXT`) or none did
        (:data:`UNREACHABLE_TEXT`).
        """
        if item.answered:  # its reply came while this attempt was out: no retry
            return Outcome.DELIVERED, ""
        if outcome not in (Outcome.UNREACHABLE, Outcome.UNKNOWN):
            return outcome, text
        item.maybe_delivered |= outcome is Outcome.UNKNOWN
        pause = self.backoff(item.attempt) if item.attempt < item.tries else self._cap
        pause = max(pause, self.peers.wait_s(item.to) or 0.0)  # a down peer's next probe
        item.attempt += 1
        item.last_error = text
        if time.time() + pause < item.deadline:
            self.retried += 1
            item.due = time.time() + pause
            heapq.heappush(self._delayed, item)
            self._wake.set()
            return None
        if item.maybe_delivered:
            return Outcome.UNKNOWN, f"{UNKNOWN_TEXT}: {text}"
        return Outcome.UNREACHABLE, f"{UNREACHABLE_TEXT}: {text}"

    def _note_peer(self, to: int, outcomes: list[Judged]) -> None:
        """Learn whether ``to`` answers; one line when that changes."""
        change = self.peers.noted(to, outcomes)
        if change is None:
            return
        if change[0] == "down":
            why = next(t for o, t in outcomes if o in (Outcome.UNREACHABLE, Outcome.UNKNOWN))
            log.warning("bus: twin %s unreachable: %s", to, why)
            return
        log.warning("bus: twin %s reachable again after %.1fs", to, change[1])
        self._gate.forget(lambda key: isinstance(key, tuple) and key[-1] == to)
        for kind in Kind:  # what waited for the probe goes now
            self._schedule((to, kind))

    def _count(self, item: Outbound, final: Judged) -> None:
        outcome, text = final
        key = (item.kind.value, outcome.value)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        if outcome is Outcome.DELIVERED:
            return
        # One line per failure class and peer every LOG_EVERY_S: a dead peer fails everything.
        self._gate.failed(
            (item.kind.value, outcome.value, item.to),
            "bus: %s %s to twin %s failed: %s (more of this kind counted in /metrics)",
            item.kind.value, item.uid, item.to, text,
        )  # fmt: skip

    async def _record(self, finals: list[Final]) -> None:
        for item, _, _ in finals:
            self._room.release()
            if self._held.get(item.uid) is item:
                del self._held[item.uid]
        try:
            await self._done(finals)
        except Exception:  # the boundary: the items stay in the backlog / outbox
            log.exception("bus: recording the outcome of %d item(s) failed", len(finals))

    async def _scheduler(self) -> None:
        while True:
            now = time.time()
            while self._delayed and self._delayed[0].due <= now:
                self._enqueue(heapq.heappop(self._delayed))
            wait = self._delayed[0].due - now if self._delayed else 1.0
            self._wake.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation
            # that comes as the wake-up does (see pipeline.bus.tasks)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(wait, 1.0))):
                    await self._wake.wait()

    # --- one POST ------------------------------------------------------------

    async def _send(
        self, to: int, kind: Kind, items: list[Outbound]
    ) -> tuple[list[Judged], list[Judged]] | None:
        """Outcomes of ``items`` (in order) after one POST, and those of the items it
        carried (what the peer said, or its silence: [] when none went); None: resend
        them singly.

        The steps: set aside what expired, resolve the destination, frame and sign
        the body, POST it, classify the answer. Only :class:`~pipeline.errors.PostUnanswered` (no
        answer: nothing or maybe something reached the peer) is caught here.
        """
        await post.mark_answered(items, self._pending)  # a reply the standby took, too
        early = post.expired(items, time.time())
        live = [item for item, result in zip(items, early, strict=True) if result is None]
        if not live:
            return [result for result in early if result is not None], []
        try:
            peer = await post.resolve(self._directory, to)
            if peer is None:
                return [(Outcome.REFUSED, "destination not found")] * len(items), []
            path = post.path_of(kind)
            body, headers = post.prepare(
                live, src=self.twin, dst=to, path=path, signer=self._signer
            )
            assert self._session is not None
            answer = await post.exchange(self._session, peer.url + path, body, headers)
        except PostUnanswered as exc:
            heard = [post.unanswered(exc)] * len(live)
            return post.merge(early, heard), heard
        judged = self._classify(to, live, answer)
        return None if judged is None else (post.merge(early, judged), judged)

    def _classify(self, to: int, live: list[Outbound], answer: post.Answer) -> list[Judged] | None:
        """The outcomes of the items ``to`` answered for; None when it refused a batch."""
        self.posts += 1
        if answer.batching:
            self._batching.add(to)
        if len(live) > 1 and answer.status in post.NO_BATCH:
            log.warning(
                "bus: twin %s refused a batch (HTTP %s): single envelopes", to, answer.status
            )
            self._single_until[to] = time.time() + SINGLE_FOR_S
            return None
        judged = post.judge_answer(live, answer)
        self.sent += len(live)
        return judged
