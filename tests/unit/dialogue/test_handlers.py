"""The handler runner's duplex tasks end cleanly whatever the connection does meanwhile."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from pipeline.dialogue import events as ev
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.handlers import HandlerRunner
from pipeline.errors import DialogueClosed


class _Host:
    """A connection that closes while a duplex's end waits to be flushed."""

    name = "test"
    closed = False

    def __init__(self) -> None:
        self.paused: set[object] = set()

    def respond(self, pid: int, data: bytes | None) -> None: ...

    def accept_duplex(self, pid: int, data: bytes | None) -> Duplex:
        duplex = Duplex(self, pid, False, data, 1 << 16)  # type: ignore[arg-type]
        duplex.sending = True
        return duplex

    def refuse_duplex(self, duplex: Duplex, error: bytes) -> None: ...

    def pause_reading(self, key: object) -> None:
        self.paused.add(key)

    def resume_reading(self, key: object) -> None:
        self.paused.discard(key)

    def duplex_consumed(self, duplex: Duplex, nbytes: int, low: bool) -> None: ...

    async def duplex_end(self, duplex: Duplex, error: bytes | None) -> None:
        await asyncio.sleep(0)
        raise DialogueClosed("dialogue closed")

    def __getattr__(self, name: str) -> Any:  # the rest of DuplexHost: not reached here
        raise AttributeError(name)


async def test_an_end_the_closing_connection_refuses_leaves_no_unretrieved_error() -> None:
    """Before: the duplex task died with DialogueClosed that nobody retrieved ("Task
    exception was never retrieved" when it was collected)."""
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))

    async def handler(duplex: Duplex) -> None:
        return None

    host = _Host()
    runner = HandlerRunner(
        host, on_message=None, on_request=None, on_duplex=handler,
        max_queued_messages=8, max_handlers=8,
    )  # fmt: skip
    runner.duplex_opened(ev.DuplexOpened(id=1, data=None))
    (task,) = runner.tasks()
    await asyncio.wait([task])
    assert not task.cancelled() and task.exception() is None, task.exception()
    del task
    gc.collect()
    await asyncio.sleep(0)
    assert unretrieved == []
    assert runner.tasks() == []
