"""The send buffer of one connection, and the wake-ups of the live fan-out.

Theory of operation. Every text a connection sends goes through its bounded
:class:`Outbox` and is written by one sender at a time, in order: the
connection's writer task, or, for live blocks, the fan-out itself.

The live hub publishes a block to every subscriber in one synchronous loop
(each listener appends shared frames to its outbox). Waking each idle writer
task for that would cost a task switch per subscriber and block. So, while
the hub publishes, a :class:`FanoutBatch` is *held*: an outbox whose writer is
idle is only noted. The hub's owner then awaits :meth:`FanoutBatch.flush`,
which hands each noted outbox to its ``inline`` sender (the connection sends
what it can right there, see :meth:`pipeline.chain.serve.wsconn.Connection`) and
wakes the writer for whatever is left. A publish nobody flushes still wakes
every noted writer (on the next loop iteration): nothing waits forever.

Before all that, a live block's shared frames come with their websocket
frames built once for every subscriber (``wire``,
:class:`~pipeline.chain.burst.SharedFrames`): an outbox with nothing queued
hands them to its ``direct`` writer, which writes them at once when its
connection sends nothing else and its transport's buffer is empty (one
``transport.write``, no coroutine, no wake-up), and queues them otherwise.

Catch-up waits for room (:meth:`Outbox.put`); live fan-out never waits
(:meth:`Outbox.offer`): a full outbox means the subscriber fell behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence

from pipeline.errors import SlowConsumer


class FanoutBatch:
    """Writer wake-ups deferred while the hub publishes one block (see the module doc)."""

    def __init__(self) -> None:
        self.holding = False
        self._pending: list[Outbox] = []
        self._fallback: asyncio.Handle | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Defer wake-ups inside the block; schedule the fallback wake-up after it."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self._pending and self._fallback is None:
                self._fallback = asyncio.get_running_loop().call_soon(self._wake_all)

    def note(self, box: Outbox) -> None:
        self._pending.append(box)

    async def flush(self) -> None:
        """Let each noted outbox send inline, then wake its writer for anything left."""
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        pending, self._pending = self._pending, []
        # What an Outbox method would do, spelt out: no coroutine per subscriber and block.
        for box in pending:
            box._noted = False
            if box._items:
                if box._inline is not None:
                    await box._inline()
                if box._items:
                    box._wake()

    def _wake_all(self) -> None:
        self._fallback = None
        pending, self._pending = self._pending, []
        for box in pending:
            box.release_now()


class Budget:
    """What several outboxes (the duplexes of one Dialogue connection) may hold together, in
    messages and in bytes; an outbox with a budget takes only what fits in both.

    ``peak_bytes`` is the most it held at once. Room is signalled to the outboxes' waiting
    catch-ups when it falls to half of either bound.
    """

    __slots__ = ("max_bytes", "max_messages", "messages", "nbytes", "peak_bytes", "_room")

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("budget bounds must be positive")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.messages = 0
        self.nbytes = 0
        self.peak_bytes = 0
        self._room = asyncio.Event()
        self._room.set()

    def fits(self, count: int, nbytes: int) -> bool:
        """Whether ``count`` more texts of ``nbytes`` in all fit (anything fits an empty one)."""
        if not self.messages:
            return True
        return self.messages + count <= self.max_messages and self.nbytes + nbytes <= self.max_bytes

    def take(self, count: int, nbytes: int) -> None:
        self.messages += count
        self.nbytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.nbytes)

    def give(self, count: int, nbytes: int) -> None:
        self.messages -= count
        self.nbytes -= nbytes
        if (
            not self._room.is_set()
            and self.messages <= self.max_messages // 2
            and self.nbytes <= self.max_bytes // 2
        ):
            self._room.set()

    async def wait(self) -> None:
        """Until the budget falls to half of its bounds."""
        self._room.clear()
        await self._room.wait()


class Outbox:
    """Bounded queue of encoded texts to send on one connection.

    The writer task waits on one bare future (no :class:`asyncio.Event` and
    its waiter list: live fan-out appends for every subscriber and block);
    catch-up's producers wait for room on an event, set only while one
    waits. With a ``batch``, an offer made while it is held does not wake the
    writer: the batch's flush calls ``inline`` (an awaitable sender that
    must never wait, and sends nothing while the writer sends), then wakes
    the writer if anything is left. With a ``direct`` writer, an offer with
    ``wire`` made while nothing is queued is first handed to it (see the module
    doc); it returns False, having written nothing, when it cannot write now.
    """

    __slots__ = (
        "_batch",
        "_budget",
        "_direct",
        "_inline",
        "_items",
        "_noted",
        "_room",
        "_waiter",
        "limit",
        "stall_s",
    )

    def __init__(
        self,
        limit: int,
        *,
        batch: FanoutBatch | None = None,
        inline: Callable[[], Awaitable[None]] | None = None,
        direct: Callable[[bytes, int], bool] | None = None,
        stall_s: float | None = None,
        budget: Budget | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("outbox limit must be positive")
        self.limit = limit
        #: How long :meth:`put` waits for room before the subscriber counts as too slow.
        self.stall_s = stall_s
        self._items: deque[bytes] = deque()
        #: the writer waiting for texts (None: not waiting, or already woken)
        self._waiter: asyncio.Future[None] | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._batch = batch
        self._inline = inline
        self._direct = direct
        self._noted = False
        #: shared with the other outboxes of one peer (None: this outbox's limit only)
        self._budget = budget

    def __len__(self) -> int:
        return len(self._items)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def offer(self, texts: Sequence[bytes], wire: bytes | None = None) -> bool:
        """Queue now if there is room for all of them, else False (nothing queued).

        ``wire``: the websocket frames of ``texts`` back to back, written by the
        ``direct`` writer instead when nothing is queued and it can write now.
        """
        items = self._items
        direct = self._direct
        if wire is not None and not items and direct is not None and direct(wire, len(texts)):
            return True
        if len(items) + len(texts) > self.limit:
            return False
        budget = self._budget
        if budget is not None:
            nbytes = sum(map(len, texts))
            if not budget.fits(len(texts), nbytes):
                return False
            budget.take(len(texts), nbytes)
        items.extend(texts)
        if self._waiter is not None:
            batch = self._batch
            if batch is not None and batch.holding:
                if not self._noted:
                    self._noted = True
                    batch.note(self)
            else:
                self._wake()
        return True

    def release_now(self) -> None:
        """The batch's fallback (nobody flushed): wake the writer."""
        self._noted = False
        if self._items:
            self._wake()

    async def put(self, texts: list[bytes]) -> None:
        """Queue, waiting for room; a list longer than the limit goes in once the queue is empty.

        :class:`SlowConsumer` when no room came (the queue did not drain to half
        its limit) within ``stall_s``: a reader that stopped reading is let go,
        not waited for forever. One clock for the whole wait: room that another
        outbox of the budget took first does not start it again.
        """
        budget = self._budget
        nbytes = sum(map(len, texts)) if budget is not None else 0
        room: Awaitable[object]
        try:
            async with asyncio.timeout(self.stall_s):
                while True:
                    if self._items and len(self._items) + len(texts) > self.limit:
                        self._room.clear()
                        room = self._room.wait()
                    elif budget is not None and not budget.fits(len(texts), nbytes):
                        room = budget.wait()
                    else:
                        break
                    await room
        except TimeoutError:
            raise SlowConsumer(
                f"send buffer of {self.limit} messages full for {self.stall_s}s",
                public=f"subscriber too slow: send buffer of {self.limit} messages full",
            ) from None
        if budget is not None:
            budget.take(len(texts), nbytes)
        self._items.extend(texts)
        self._wake()

    async def wait(self, *, fresh: bool = False) -> None:
        """Return once something is queued (at once if something is, unless ``fresh``:
        then at the next wake-up)."""
        if self._items and not fresh:
            return
        waiter = self._waiter
        if waiter is None or waiter.done():
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter

    def peek(self) -> bytes | None:
        """The oldest queued text, left in place (None when empty)."""
        return self._items[0] if self._items else None

    def pop_many(self, limit: int) -> list[bytes]:
        """Up to ``limit`` queued texts, oldest first (empty when none)."""
        items = self._items
        if len(items) <= limit:
            out = list(items)
            items.clear()
        else:
            out = [items.popleft() for _ in range(limit)]
        if len(items) <= self.limit // 2 and not self._room.is_set():
            self._room.set()
        if self._budget is not None:
            self._budget.give(len(out), sum(map(len, out)))
        return out

    def clear(self) -> int:
        """Drop every queued text (its connection is being closed); how many were dropped."""
        dropped = len(self._items)
        if self._budget is not None:
            self._budget.give(dropped, sum(map(len, self._items)))
        self._items.clear()
        return dropped

    def pop(self) -> bytes | None:
        text = self._items.popleft() if self._items else None
        if len(self._items) <= self.limit // 2 and not self._room.is_set():
            self._room.set()
        if text is not None and self._budget is not None:
            self._budget.give(1, len(text))
        return text


__all__ = ["Budget", "FanoutBatch", "Outbox"]
