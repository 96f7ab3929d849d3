"""The consumer worker: one stream handled at-least-once under the stream's lease.

:class:`Consumer` holds the stream's lease (renewed every third of its TTL),
pulls (a long poll; while a big batch is handled the next pull is already in
flight), hands the entries to its handler (``handler`` per entry or
``batch_handler`` per batch) and saves its index only after the handlers
completed: at-least-once. Saves are grouped (at most every ``save_every_ms``
while busy, at once when idle, and on stop), so a crash re-delivers at most
that much. A failed entry is retried after a pause (:func:`retry_pause`:
:data:`RETRY_PAUSE_S` doubled per retry, jittered, capped), so a blip of a few
milliseconds downstream does not use up its attempts. An entry whose handler
failed ``max_failures`` times (or that can never be handled: malformed,
unroutable, too large) goes to the dead-letter stream with the reason, so one
bad entry never blocks the stream. A handler that does not finish within
``handler_timeout_s`` counts as failed (the lease is renewed while the
consumer waits for it), so a hanging handler delays the stream by at most
``max_failures`` times that, never forever. An entry that kills the process
is caught too: sessions that start without progress are counted in Redis
(``Attempts``), and after ``max_failures`` of them the consumer handles the
next batch one entry at a time, each counted before its handler runs, so the
killer is dead-lettered after ``max_failures`` more deaths instead of
crash-looping the process. On stop it abandons the pull in flight, finishes
the current batch, saves its index and releases the lease.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pipeline.errors import (
    LeaseHeld,
    LocalProtocolError,
    PullAborted,
    RemoteProtocolError,
    SluiceError,
    StreamError,
    StreamNotFound,
)
from pipeline.loggate import LogGate
from pipeline.routing.message import TransportMessage
from pipeline.routing.node import Context, Node, Worker, WorkerContext
from pipeline.streams import protocol as p
from pipeline.streams.client import PERMANENT, StreamClient

log = logging.getLogger(__name__)

#: A consumer's handler: gets (index, data); returns None when done, or a
#: future that completes when the entry was handled. Raising = a failure.
Handler = Callable[[str, bytes], Awaitable["asyncio.Future[None] | None"]]

#: A consumer's batch handler: gets the entries, returns one outcome per entry:
#: None (handled), a future that completes when it is handled, or the exception
#: that made it fail.
BatchHandler = Callable[[list[tuple[str, bytes]]], Awaitable[list[Any]]]

#: A pull answer at least this long makes the consumer pull again before handling it.
PREFETCH_AT = 64

#: The pause before a failed entry's first retry, in seconds; doubled for each further one.
RETRY_PAUSE_S = 0.05
#: The longest pause before one retry (also at most a sixth of the lease's TTL, see
#: Consumer._pause); with the default three attempts an entry waits 0.15 s at most in all.
RETRY_PAUSE_MAX_S = 1.0


def retry_pause(retry: int, cap: float) -> float:
    """Seconds to wait before retry ``retry`` (1 for the first): :data:`RETRY_PAUSE_S`
    doubled per retry, at most ``cap``, drawn from the upper half of that (jitter:
    consumers that failed together do not retry together; never zero)."""
    pause = min(RETRY_PAUSE_S * 2 ** min(retry - 1, 30), cap)
    return random.uniform(pause / 2, pause)


def _id_key(index: str) -> tuple[int, int]:
    """Order of Redis entry ids ("ms-seq"); anything else sorts first."""
    ms, _, seq = index.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq.isdigit() or not seq) else (-1, -1)


def _wake(waiter: asyncio.Future[None], *_: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Consumer(Worker):
    """Consumes ``stream`` from its saved index, at-least-once, holding the stream's lease."""

    mailbox_size = 64

    def __init__(
        self,
        stream: str,
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        client_id: str,
        holder: str,
        max_failures: int = 3,
        batch: int = 1000,
        wait_ms: int = 500,
        lease_ttl_ms: int = 15_000,
        service: str = "stream_service",
        backoff_max_s: float = 2.0,
        save_every_ms: int = 100,
        handler_timeout_s: float = 60.0,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise LocalProtocolError("a consumer needs exactly one of handler, batch_handler")
        self.stream = stream
        self.handler = handler
        self.batch_handler = batch_handler
        self.client_id = client_id
        self.holder = holder
        self.max_failures = max(1, max_failures)
        self.batch = batch
        self.wait_ms = min(wait_ms, max(50, lease_ttl_ms // 3))
        self.lease_ttl_ms = lease_ttl_ms
        self.service = service
        self.backoff_max_s = backoff_max_s
        self.save_every_ms = save_every_ms
        self.handler_timeout_s = handler_timeout_s
        self._renewed = 0.0
        self._marker: str | None = None
        #: Handled up to here (in memory) / saved up to here (in Redis).
        self.index = ""
        self.saved = ""
        self._saved_at = 0.0
        self.ready = asyncio.Event()
        self.refused: LeaseHeld | None = None
        self._stop = asyncio.Event()
        self._client: StreamClient | None = None
        self._node: Node | None = None
        self._has_lease = False
        #: Retried session failures by class: one line per interval, one when they end.
        self._gate = LogGate(log, level=logging.ERROR)

    async def setup(self, wctx: WorkerContext) -> None:
        self._node = wctx.node
        self._client = StreamClient(wctx.node, wctx.address, service=self.service)

    def intercept(self, message: TransportMessage) -> bool:
        return self._client is not None and self._client.intercept(message)

    async def handle(self, ctx: Context) -> None:
        assert self._node is not None
        self._node.counters["consumer.unexpected_messages"] += 1
        log.warning("consumer %s: unexpected message %r", self.stream, ctx.message)

    def stopping(self) -> None:
        self._stop.set()
        if self._client is not None:
            self._client.abort_pulls()  # interrupt the long poll

    def _count(self, what: str, n: int = 1) -> None:
        assert self._node is not None
        self._node.counters[f"consumer.{what}"] += n

    async def run(self, wctx: WorkerContext) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                await self._session()
                delay = 0.05
            except LeaseHeld as exc:
                self.refused = exc
                self._has_lease = False
                self._count("lease_refused")
                log.error("consumer %s: %s", self.stream, exc)
            except StreamNotFound as exc:
                self._count("stream_missing")
                log.error("consumer %s: stream vanished, creating it again: %s", self.stream, exc)
            except SluiceError as exc:  # Redis down, service timeout, bad reply: retry
                self._count("errors")
                self._gate.failed(type(exc).__name__, "consumer %s: %s; retrying", self.stream, exc)
            except Exception:  # a bug: logged with its traceback and counted; the stream goes on
                self._count("crashes")
                log.exception("consumer %s: session failed; retrying in %.2fs", self.stream, delay)
            else:
                continue
            await self._sleep(delay)
            delay = min(delay * 2, self.backoff_max_s)
        await self._finish()

    async def _sleep(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        except TimeoutError:
            pass

    def _save_due(self, *, force: bool = False) -> bool:
        if self.index == self.saved or self.index == "0-0":
            return False
        return force or time.monotonic() - self._saved_at >= self.save_every_ms / 1000

    async def _save(self, *, force: bool = False) -> None:
        """Save the index of what was handled, at most every ``save_every_ms`` unless forced."""
        assert self._client is not None
        if not self._save_due(force=force):
            return
        now = time.monotonic()
        self.saved = await self._client.save_index(self.client_id, self.stream, self.index)
        self._saved_at = now

    async def _finish(self) -> None:
        if self._has_lease and self._client is not None:
            try:
                await self._save(force=True)
                await self._clear_marker()  # a graceful stop is not a crash
            except (StreamError, RemoteProtocolError) as exc:
                self._count("errors")
                log.error(
                    "consumer %s: index %s not saved on stop: %s", self.stream, self.index, exc
                )
        if self._has_lease and self._client is not None:
            try:
                await self._client.release(self.stream, self.holder)
            except (StreamError, RemoteProtocolError) as exc:
                log.warning("consumer %s: lease not released: %s", self.stream, exc)
            self._has_lease = False

    async def _session(self) -> None:
        """One session under the lease: open the stream, then pull and handle until stopped."""
        client = self._client
        assert client is not None
        address = await self._open(client)
        isolate = await self._crash_guard(client)
        await self._consume(client, address, isolate)

    async def _open(self, client: StreamClient) -> str:
        """Take the lease, open the stream and read where to start; the stream's address."""
        await client.lease(self.stream, self.holder, self.lease_ttl_ms)
        self._has_lease = True
        self.refused = None
        self._renewed = time.monotonic()
        address = (await client.create(self.stream)).address
        saved = await client.get_index(self.client_id, self.stream)
        self.saved = saved
        # What this process already handled (and may not have saved yet) is not handled again.
        self.index = self.index if _id_key(self.index) > _id_key(saved) else saved or "0-0"
        self.ready.set()
        for key in self._gate.open_keys():
            self._gate.ended(key, "consumer %s: session started again", self.stream)
        return address

    async def _crash_guard(self, client: StreamClient) -> bool:
        """Count this session's start in Redis; True: handle the next batch one entry at a time.

        Sessions that start without the previous one having made progress are
        counted. More than max_failures of them mean an entry ahead kills this
        process: go one entry at a time, counting each.
        """
        marker = f"{self.client_id}:sessions"
        isolate = await client.attempts(self.stream, marker, p.INCR) > self.max_failures
        self._marker = marker
        if isolate:
            self._count("isolated_sessions")
            log.warning("consumer %s: restarted often without progress; isolating", self.stream)
        return isolate

    async def _consume(self, client: StreamClient, address: str, isolate: bool) -> None:
        """Pull, handle and save until stopped (a pull aborted by the stop ends it quietly)."""
        started_at = self.saved
        # While a big batch is handled (and its index saved) the next pull is
        # already in flight; after a small one, pull afterwards (lower latency).
        pending: asyncio.Future[p.Messages] | None = None
        try:
            while not self._stop.is_set():
                if pending is not None:
                    reply = await pending
                    pending = None
                else:
                    reply = await client.pull(address, self.index, self.batch, self.wait_ms)
                next_index = reply.next_index or self.index
                if len(reply.messages) >= PREFETCH_AT:
                    pending = asyncio.ensure_future(
                        client.pull(address, next_index, self.batch, self.wait_ms)
                    )
                isolate = await self._handle_pulled(reply.messages, isolate)
                self.index = next_index
                await self._after_batch(idle=not reply.messages, isolate=isolate, since=started_at)
        except PullAborted:
            return  # stopping: what that pull would have got is pulled again next time
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)

    async def _handle_pulled(self, messages: Sequence[tuple[str, bytes]], isolate: bool) -> bool:
        """Hand a pull's entries to the handlers (one at a time if ``isolate``); whether
        the next batch is still to be isolated (not once one was handled)."""
        if not messages:
            return isolate
        if isolate:
            await self._process_isolated(list(messages))
        else:
            await self._process(list(messages))
        self._count("handled", len(messages))
        return False

    async def _after_batch(self, *, idle: bool, isolate: bool, since: str) -> None:
        """Save the index if due, clear the crash marker on progress, renew the lease if due."""
        # Saved after the handlers completed (at-least-once); when idle, at once.
        if self._save_due(force=idle):
            await self._save(force=idle)
        if self._marker is not None and not isolate and self.saved != since:
            await self._clear_marker()  # progress: this session did not crash-loop
        if self._lease_due():
            await self._keep_lease()

    async def _clear_marker(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None and self._client is not None:
            await self._client.attempts(self.stream, marker, p.CLEAR)

    async def _process_isolated(self, entries: list[tuple[str, bytes]]) -> None:
        """One entry at a time, each counted in Redis before its handler runs and its
        index saved after: an entry that killed the process ``max_failures`` times is
        dead-lettered instead of handled again."""
        client = self._client
        assert client is not None
        for index, data in entries:
            key = f"{self.client_id}#{index}"
            tries = await client.attempts(self.stream, key, p.INCR)
            if tries > self.max_failures:
                died = StreamError("the consumer's process died while handling it")
                await self._dead_letter(index, data, died, tries - 1)
            else:
                await self._process([(index, data)])
            self.index = index
            await self._save(force=True)
            await client.attempts(self.stream, key, p.CLEAR)

    def _lease_due(self) -> bool:
        return time.monotonic() - self._renewed > self.lease_ttl_ms / 3000

    async def _keep_lease(self) -> None:
        """Renew the lease if a third of its TTL passed since the last renewal."""
        if self._lease_due():
            assert self._client is not None
            await self._client.lease(self.stream, self.holder, self.lease_ttl_ms)
            self._renewed = time.monotonic()

    async def _wait_handled(self, outcome: asyncio.Future[None], deadline: float) -> None:
        """Wait for a handler's outcome until ``deadline``, renewing the lease meanwhile.

        What ``asyncio.wait([outcome], timeout=...)`` does, without its sets and
        extra callbacks (it ran twice per stream-transport round trip).
        """
        loop = asyncio.get_running_loop()
        while not outcome.done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise StreamError(f"handler did not finish in {self.handler_timeout_s}s")
            waiter: asyncio.Future[None] = loop.create_future()
            wake = functools.partial(_wake, waiter)
            outcome.add_done_callback(wake)
            timer = loop.call_later(min(left, self.lease_ttl_ms / 3000), _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                outcome.remove_done_callback(wake)
            if not outcome.done():
                await self._keep_lease()

    async def _process(self, entries: list[tuple[str, bytes]]) -> None:
        """Handle ``entries``: a failed one is retried, after a pause (:meth:`_pause`), until
        it succeeds, fails ``max_failures`` times or fails for good, then it is dead-lettered.
        A cancellation, in a handler's wait or in a pause, propagates."""
        failures: dict[str, int] = {}
        todo = entries
        retry = 0
        while todo:
            if retry:
                await self._pause(retry)
            todo = await self._attempt(todo, failures)
            retry += 1

    async def _pause(self, retry: int) -> None:
        """Wait before retry ``retry`` (:func:`retry_pause`, at most a sixth of the lease's
        TTL), renewing the lease first if a third of its TTL passed."""
        await self._keep_lease()
        await asyncio.sleep(retry_pause(retry, min(RETRY_PAUSE_MAX_S, self.lease_ttl_ms / 6000)))

    async def _attempt(
        self, todo: list[tuple[str, bytes]], failures: dict[str, int]
    ) -> list[tuple[str, bytes]]:
        """Hand ``todo`` to the handler once and wait for the outcomes; the entries to
        retry (``failures`` counts each entry's failed attempts)."""
        started = await self._start(todo)
        deadline = time.monotonic() + self.handler_timeout_s
        retry: list[tuple[str, bytes]] = []
        for index, data, outcome in started:
            error = outcome if isinstance(outcome, BaseException) else None
            if isinstance(outcome, asyncio.Future):
                try:
                    await self._wait_handled(outcome, deadline)
                    outcome.result()
                except asyncio.CancelledError:
                    if self._cancelling():
                        raise
                    error = StreamError("handler was cancelled")
                except Exception as exc:  # noqa: BLE001 - same: counted below, never hidden
                    error = exc
            if error is None:
                continue
            failures[index] = failures.get(index, 0) + 1
            self._count("handler_failures")
            if isinstance(error, PERMANENT) or failures[index] >= self.max_failures:
                await self._dead_letter(index, data, error, failures[index])
            else:
                retry.append((index, data))
        return retry

    async def _start(self, todo: list[tuple[str, bytes]]) -> list[tuple[str, bytes, Any]]:
        """Hand entries to the handler; (index, data, outcome) for each."""
        if self.batch_handler is not None:
            try:
                outcomes = await self.batch_handler(todo)
            except Exception as exc:  # noqa: BLE001 - the application's code: every entry failed, retried
                outcomes = [exc] * len(todo)
            return [(i, d, o) for (i, d), o in zip(todo, outcomes, strict=True)]
        assert self.handler is not None
        started: list[tuple[str, bytes, Any]] = []
        for index, data in todo:
            try:
                started.append((index, data, await self.handler(index, data)))
            except Exception as exc:  # noqa: BLE001 - the application's handler: counted, retried, dead-lettered
                started.append((index, data, exc))
        return started

    @staticmethod
    def _cancelling() -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _dead_letter(self, index: str, data: bytes, error: BaseException, tries: int) -> None:
        assert self._client is not None
        reason = f"{type(error).__name__}: {error} (after {tries} attempt(s))"
        log.error("consumer %s: entry %s dead-lettered: %s", self.stream, index, reason)
        await self._client.dead_letter(self.stream, index, data, reason)
        self._count("dead_lettered")
