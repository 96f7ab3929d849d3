"""The receiving twin's handler of a bus history, in its own process; its log is the judge.

``python -m tests.history.bushandler --redis URL --log FILE`` serves the command
``work`` with the Python SDK's :class:`~pipeline.bus.BusServer`. Each execution
appends one JSON line to ``FILE`` *before* the work is done (written with one
``os.write`` on an ``O_APPEND`` descriptor, so a line is whole and on its way to
disk whatever happens to this process next), then holds for the call's ``hold``
milliseconds and answers ``done:<call>``::

    {"call": "c17", "uid": "1002.1795...", "try": 3, "t": 1795.2, "pid": 4242}

A call's data is JSON ``{"call": id, "hold": ms}`` (:func:`payload`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

from pipeline.bus.envelope import Envelope
from pipeline.bus.server import BusServer

CMD = "work"


def payload(call: str, hold_ms: int) -> bytes:
    return json.dumps({"call": call, "hold": hold_ms}).encode()


def answer_of(call: str) -> bytes:
    """What the handler answers for ``call``."""
    return b"done:" + call.encode()


class Log:
    """The executions, one line each, appended with one write."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def execution(self, call: str, request: Envelope) -> None:
        line = {"call": call, "uid": request.uid, "try": request.try_, "t": time.time(),
                "pid": os.getpid()}  # fmt: skip
        os.write(self.fd, (json.dumps(line) + "\n").encode())


async def serve(redis_url: str, log_path: str) -> None:
    log = Log(log_path)

    async def work(data: bytes, request: Envelope) -> bytes:
        doc = json.loads(data)
        log.execution(str(doc["call"]), request)
        await asyncio.sleep(int(doc["hold"]) / 1000)
        return answer_of(str(doc["call"]))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with BusServer.from_url(redis_url, workers=4, batch=32) as server:
        server.handler(CMD)(work)
        serving = asyncio.create_task(server.serve())
        sys.stdout.write("handler serving\n")  # what the harness waits for
        sys.stdout.flush()
        await stop.wait()
        await server.close()
        await serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.redis, args.log))


if __name__ == "__main__":
    main()
