"""Ending a bus's tasks for sure, within a deadline.

One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for``,
which redis-py awaits to send every command when a socket timeout is set,
returns the command's result and drops a cancellation that arrives in the
loop turn its write completes (CPython gh-86296, fixed in 3.12). The task
then goes on as if nothing happened, with its ``cancelling()`` count still
raised. Under load that window is hit often, and a stopped bus whose seat
or coalescer went on running held its twin's lease against its own restart.

So the bus's loops check the count once per turn
(:func:`pipeline.redisio.conn.checkpoint`), and :func:`end` cancels again
whatever is still running after a while, so that a task that dropped its
cancellation anywhere else still ends. No Redis here: only asyncio.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

#: Seconds a cancelled task gets to end (its own cleanup included) before it is
#: cancelled again: long enough for any cleanup of the bus, short next to a stop's grace.
RECANCEL_S = 1.0


async def end(
    tasks: Iterable[asyncio.Task[Any]], grace_s: float, *, recancel_s: float = RECANCEL_S
) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` and wait up to ``grace_s`` for their end; the ones still running.

    A task still running ``recancel_s`` after its cancellation is cancelled
    again (it dropped the first), and so on until the deadline. Failures of
    the tasks are left in them for the caller to read.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(recancel_s, left))
    return pending
