"""A bus handler in a process of its own, for tests/integration/bus/test_handler_death.py.

``python -m tests.integration.bus.handler_proc --redis URL --log FILE --die MODE``
serves ``work`` on the bus whose Redis is URL, appends one JSON line per execution
to FILE (its pid, the request's uid and ``request.redelivered``), and, in the middle
of a call, ends the process with ``os._exit(3)``: never, on a request's first
delivery only (``first``), or always. It prints "handler serving" once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from pipeline.bus.envelope import Envelope
from pipeline.bus.server import BusServer


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--die", choices=("never", "first", "always"), default="never")
    parser.add_argument("--ttl", type=float, default=1.0)
    args = parser.parse_args()
    server = BusServer.from_url(args.redis, workers=1, handler_ttl_s=args.ttl)
    log = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @server.handler("work")
    async def work(data: bytes, request: Envelope) -> bytes:
        run = {"pid": os.getpid(), "uid": request.uid, "redelivered": request.redelivered}
        os.write(log, (json.dumps(run) + "\n").encode())  # one append, before any death
        if args.die == "always" or (args.die == "first" and not request.redelivered):
            os._exit(3)  # mid-call: no reply, no cleanup
        return b"done:" + data

    async with server:
        sys.stdout.write("handler serving\n")
        sys.stdout.flush()
        await server.serve()


if __name__ == "__main__":
    asyncio.run(main())
