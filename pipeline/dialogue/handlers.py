"""The application's side of incoming traffic: calling handlers and owning the tasks that run them.

``on_message(data)`` and ``on_request(data) -> bytes | None`` may be plain
functions (called inline by the reader: the fast path) or coroutine
functions; ``on_duplex(duplex)`` is a coroutine function. Async message
handlers run one at a time, in order, from a queue bounded in messages and in
bytes (``max_queued_bytes``: a stalled handler cannot make a peer's 1 MiB
frames pile up by the thousand); each async request
and each incoming duplex gets an owned task, at most ``max_handlers`` of each.
Over a bound, the connection stops reading its transport until the backlog
halves. A request handler returning None or raising declines the request (an
empty Response); exceptions are logged here, never sent to the peer.

The runner talks to its connection only through :class:`RunnerHost`.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pipeline.dialogue import events as ev
from pipeline.dialogue.duplex import Duplex
from pipeline.errors import DialogueError

log = logging.getLogger(__name__)

MessageHandler = Callable[[bytes], Any]
RequestHandler = Callable[[bytes], Any]
DuplexHandler = Callable[[Duplex], Awaitable[None]]

#: Error data sent when a duplex handler fails or none is installed (details stay in our logs).
HANDLER_FAILED = b"handler failed"
NO_HANDLER = b"no duplex handler"


class Backlog(enum.Enum):
    """A backlog of the runner that pauses the connection's reading while over its bound."""

    MESSAGES = "messages"
    REQUESTS = "requests"
    DUPLEXES = "duplexes"


class RunnerHost(Protocol):
    """What the :class:`HandlerRunner` needs from its connection."""

    @property
    def name(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def respond(self, pid: int, data: bytes | None) -> None:
        """Answer the peer's request (``None`` declines); a no-op once it is not pending."""
        ...

    def accept_duplex(self, pid: int, data: bytes | None) -> Duplex:
        """Track a duplex the peer opened; its ``sending`` says whether we may still send."""
        ...

    def refuse_duplex(self, duplex: Duplex, error: bytes) -> None:
        """End our half of an incoming duplex at once with ``error`` (no handler)."""
        ...

    def pause_reading(self, key: object) -> None:
        """A backlog is over its bound: stop reading the transport until ``key`` resumes."""
        ...

    def resume_reading(self, key: object) -> None: ...


class HandlerRunner:
    """Calls the connection's handlers and owns the tasks that run them."""

    def __init__(
        self,
        conn: RunnerHost,
        *,
        on_message: MessageHandler | None,
        on_request: RequestHandler | None,
        on_duplex: DuplexHandler | None,
        max_queued_messages: int,
        max_handlers: int,
        max_queued_bytes: int = 8 << 20,
    ) -> None:
        self.conn = conn
        self.on_message = on_message
        self.messages_async = inspect.iscoroutinefunction(on_message)
        self.on_request = on_request
        self.on_duplex = on_duplex
        self.max_queued_messages = max_queued_messages
        self.max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0
        self.max_handlers = max_handlers
        self._messages: deque[bytes] = deque()
        self._message_waiter: asyncio.Future[None] | None = None
        self._request_tasks: dict[int, asyncio.Task[None]] = {}
        self._duplex_tasks: set[asyncio.Task[None]] = set()

    @property
    def queued_bytes(self) -> int:
        """Data of messages waiting for the async message handler."""
        return self._queued_bytes

    def tasks(self) -> list[asyncio.Task[None]]:
        return [*self._request_tasks.values(), *self._duplex_tasks]

    def connection_closed(self) -> None:
        for task in self._request_tasks.values():
            task.cancel()
        self._wake_messages()

    # ---------------------------------------------------------------- messages

    def message_received(self, event: ev.MessageReceived) -> None:
        data = event.data
        handler = self.on_message
        if handler is None:
            log.debug("%s: message dropped, no handler", self.conn.name)
            return
        if not self.messages_async:
            try:
                handler(data)
            except Exception:
                log.exception("%s: message handler failed", self.conn.name)
            return
        self._messages.append(data)
        self._queued_bytes += len(data)
        if (
            len(self._messages) >= self.max_queued_messages
            or self._queued_bytes >= self.max_queued_bytes
        ):
            self.conn.pause_reading(Backlog.MESSAGES)
        self._wake_messages()

    def _wake_messages(self) -> None:
        waiter = self._message_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def dispatch_messages(self) -> None:
        """The message task: run the async handler over the queue, in order."""
        handler = self.on_message
        assert handler is not None
        queue = self._messages
        low = self.max_queued_messages // 2
        low_bytes = self.max_queued_bytes // 2
        while True:
            while queue:
                data = queue.popleft()
                self._queued_bytes -= len(data)
                if len(queue) < low and self._queued_bytes < low_bytes:
                    self.conn.resume_reading(Backlog.MESSAGES)
                try:
                    await handler(data)
                except Exception:
                    log.exception("%s: message handler failed", self.conn.name)
            if self.conn.closed:
                return
            self._message_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._message_waiter
            finally:
                self._message_waiter = None

    # ---------------------------------------------------------------- requests

    def request_received(self, event: ev.RequestReceived) -> None:
        pid, data = event.id, event.data
        conn = self.conn
        handler = self.on_request
        if handler is None:
            conn.respond(pid, None)
            return
        try:
            result = handler(data)
        except Exception:
            log.exception("%s: request handler failed", conn.name)
            conn.respond(pid, None)
            return
        if not inspect.isawaitable(result):
            conn.respond(pid, result)
            return
        task = asyncio.get_running_loop().create_task(
            self._answer(pid, result), name=f"{self.conn.name}-request-{pid}"
        )
        self._request_tasks[pid] = task
        task.add_done_callback(functools.partial(self._request_done, pid, result))
        if len(self._request_tasks) >= self.max_handlers:
            self.conn.pause_reading(Backlog.REQUESTS)

    def request_cancelled(self, event: ev.PeerCancelledRequest) -> None:
        """The peer cancelled: stop working on it (answering is optional now)."""
        task = self._request_tasks.get(event.id)
        if task is not None:
            task.cancel()

    async def _answer(self, pid: int, awaitable: Awaitable[bytes | None]) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            self.conn.respond(pid, None)  # a no-op when the peer cancelled or we closed
            raise
        except Exception:
            log.exception("%s: request handler failed", self.conn.name)
            result = None
        self.conn.respond(pid, result)

    def _request_done(
        self, pid: int, awaitable: Awaitable[bytes | None], task: asyncio.Task[None]
    ) -> None:
        if inspect.iscoroutine(awaitable) and inspect.getcoroutinestate(awaitable) == (
            inspect.CORO_CREATED
        ):
            # Cancelled before _answer started (a cancel or a close right after the
            # request arrived): the handler's coroutine never ran; close it unawaited.
            awaitable.close()
        if self._request_tasks.get(pid) is task:
            del self._request_tasks[pid]
        if len(self._request_tasks) <= self.max_handlers // 2:
            self.conn.resume_reading(Backlog.REQUESTS)

    # ---------------------------------------------------------------- duplexes

    def duplex_opened(self, event: ev.DuplexOpened) -> None:
        """The peer opened a duplex: hand it to ``on_duplex`` in an owned task."""
        conn = self.conn
        pid = event.id
        duplex = conn.accept_duplex(pid, event.data)
        if self.on_duplex is None:
            duplex.detached = True
            conn.refuse_duplex(duplex, NO_HANDLER)
            return
        task = asyncio.get_running_loop().create_task(
            self._run_duplex(self.on_duplex, duplex), name=f"{conn.name}-duplex-{pid}"
        )
        self._duplex_tasks.add(task)
        task.add_done_callback(self._duplex_done)
        if len(self._duplex_tasks) >= self.max_handlers:
            conn.pause_reading(Backlog.DUPLEXES)

    async def _run_duplex(self, handler: DuplexHandler, duplex: Duplex) -> None:
        error: bytes | None = None
        try:
            await handler(duplex)
        except DialogueError as exc:
            log.info("%s: duplex %d ended: %s", self.conn.name, duplex.id, exc)
            error = HANDLER_FAILED
        except Exception:
            log.exception("%s: duplex handler failed", self.conn.name)
            error = HANDLER_FAILED
        duplex.detach()
        if duplex.sending and not self.conn.closed:
            try:
                await duplex.end(error)
            except DialogueError as exc:  # closed while the end waited to be flushed
                log.debug("%s: duplex %d: end not sent: %s", self.conn.name, duplex.id, exc)

    def _duplex_done(self, task: asyncio.Task[None]) -> None:
        self._duplex_tasks.discard(task)
        if len(self._duplex_tasks) <= self.max_handlers // 2:
            self.conn.resume_reading(Backlog.DUPLEXES)
