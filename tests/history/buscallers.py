"""The callers of a bus history: bursts of calls, each with its every answer recorded.

A caller is a client written from the seed alone: it RPUSHes the request
envelope to ``msgbus.system.local`` on the sending twin's Redis and waits on
its ``ret`` list, on a connection of its own that answered PING just before the
push. It never pops an answer: it moves it (``BLMOVE``) to
``<ret>.got``, so an answer taken just before Redis died is still there when it
comes back (the caller looks there first after any error), and every further
answer stays in ``ret`` for :func:`extras` to find at the end. The request is
never pushed twice: a push that failed leaves the call ``sent = None`` (it may
have landed: nothing is owed, at most one execution).

Each call waits up to its ``exp`` plus :data:`SLACK_S` for its first answer
(less once its twin's Redis lost the data: nothing can be owed then).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pipeline import keys
from pipeline.redisio import conn as redisconn
from tests.history.bushandler import CMD, payload

#: How long past its ``exp`` a call waits for its first answer before it counts as lost.
SLACK_S = 20.0
#: Redis errors a caller rides out.
ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


@dataclass(slots=True)
class Loss:
    """A Redis losing its data: from ``start`` (before the kill or FLUSHALL) to ``end``
    (after it: infinite while it goes on), in loop time and in ``time.time()``.

    ``partial``: a failover to a replica that lacked the master's last writes: only what
    was written after ``start`` may be gone (the replica provably held everything before:
    :mod:`tests.history.busredis`)."""

    start: float
    wall_start: float
    end: float = math.inf
    wall_end: float = math.inf
    partial: bool = False


@dataclass(slots=True)
class Answer:
    t: float
    err: str
    data: bytes
    src: int
    #: found in ``ret`` at the end (after the caller stopped waiting), not when it came
    late: bool = False
    #: ``time.time()`` when it came (the handler's log is in wall time)
    wall: float = 0.0
    #: ``time.time()`` when the bus made it (the envelope's ``now``, whole seconds, rounded
    #: down; 0: not stamped): a late answer may have been made while the caller still
    #: had the right to wait, since a call exposed to a loss waits less (see the module doc)
    made: float = 0.0


@dataclass(slots=True)
class Call:
    id: str
    exp: int
    tries: int
    hold_ms: int
    dst: int
    #: loop time of the push (0: not pushed)
    issued: float = 0.0
    #: ``time.time()`` of the push
    issued_wall: float = 0.0
    #: True: pushed; False: never pushed; None: the push failed and may have landed
    sent: bool | None = False
    answers: list[Answer] = field(default_factory=list)

    @property
    def ret(self) -> str:
        return f"hist.ret.{self.id}"

    def envelope(self) -> bytes:
        doc = {
            "ver": 1, "uid": "", "cmd": CMD, "exp": self.exp, "try": self.tries,
            "dat": base64.b64encode(payload(self.id, self.hold_ms)).decode(), "src": 0,
            "dst": [self.dst], "ret": self.ret, "shm": "", "now": int(time.time()), "err": "",
        }  # fmt: skip
        return json.dumps(doc).encode()


def draw_calls(rng: random.Random, first: int, count: int, dst: int) -> list[Call]:
    """``count`` calls numbered from ``first``: random ``exp``, ``try`` and handler hold."""
    hold = rng.choice(["fast", "mixed", "slow"])
    out = []
    for n in range(first, first + count):
        if hold == "fast" or (hold == "mixed" and rng.random() < 0.8):
            hold_ms = rng.randint(0, 20)
        else:
            hold_ms = rng.randint(100, 2500)
        exp = rng.choice([1, 2, 3, 5, 8, 12])
        out.append(Call(f"c{n}", exp, rng.randint(0, 6), hold_ms, dst))
    return out


def client(url: str) -> aioredis.Redis:
    """One connection that never repeats a command by itself (a repeated RPUSH would be a
    second call); after an error, the next command connects again (on Sentinel: to the
    master the Sentinels name then, with the bus's own client of no retries)."""
    if url.startswith("redis+sentinel://"):
        return redisconn.connect(url, redisconn.Role.BUS, block_s=1.0, max_connections=1)
    return aioredis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), single_connection_client=True)


async def _push(r: aioredis.Redis, call: Call, now: Callable[[], float]) -> None:
    """RPUSH the request on a connection that just answered PING (one Redis command, never
    repeated: a failed PING sent nothing, a failed RPUSH may have landed)."""
    for _ in range(100):
        try:
            await r.ping()
        except ERRORS:
            await asyncio.sleep(0.1)
            continue
        call.issued = now()
        call.issued_wall = time.time()
        try:
            await r.rpush(keys.BUS_LOCAL, call.envelope())
            call.sent = True
        except ERRORS:
            call.sent = None  # it may have landed
        return


async def run_call(
    r: aioredis.Redis, call: Call, losses: list[Loss], now: Callable[[], float]
) -> None:
    """Push ``call`` and wait for its first answer (see the module doc)."""
    await _push(r, call, now)
    if call.sent is False:
        return
    got = call.ret + ".got"
    look = False
    while True:
        limit = call.issued + call.exp + SLACK_S
        if call.sent is None or any(loss.end > call.issued for loss in losses):
            limit = call.issued + call.exp + 2.0  # nothing is owed to it
        left = limit - now()
        if left <= 0:
            return
        try:
            raw = await r.lindex(got, 0) if look else None
            look = False
            if raw is None:
                # a fractional timeout (Redis >= 6); redis-py's hint says int
                wait: Any = min(left, 1.0)
                raw = await r.blmove(call.ret, got, wait, "LEFT", "RIGHT")
        except ERRORS:
            look = True
            await asyncio.sleep(0.2)
            continue
        if raw is not None:
            call.answers.append(decode_answer(raw, now()))
            return


def decode_answer(raw: bytes | str, t: float, *, late: bool = False) -> Answer:
    doc = json.loads(raw)
    made = doc.get("now")
    return Answer(t, str(doc.get("err", "")), base64.b64decode(doc.get("dat") or ""),
                  int(doc.get("src", 0)), late, time.time(),
                  float(made) if isinstance(made, int | float) else 0.0)  # fmt: skip


async def burst(
    url: str, calls: list[Call], concurrency: int, pace_s: float, losses: list[Loss],
    now: Callable[[], float],
) -> None:  # fmt: skip
    """Run ``calls`` with ``concurrency`` callers, each pausing up to ``pace_s`` between calls."""
    todo = list(calls)
    pauses = random.Random(len(calls) * 7919 + concurrency)  # only the pace between calls

    async def caller() -> None:
        r = client(url)
        try:
            while todo:
                await run_call(r, todo.pop(0), losses, now)
                await asyncio.sleep(pauses.uniform(0, pace_s))
        finally:
            await r.aclose()

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(caller())


async def extras(r: aioredis.Redis, calls: list[Call], now: float) -> None:
    """Every answer still in a call's ``ret``: a second one, or one past the caller's wait."""
    for call in calls:
        if call.sent is False:
            continue
        for raw in await r.lrange(call.ret, 0, -1):
            call.answers.append(decode_answer(raw, now, late=True))


__all__ = ["ERRORS", "SLACK_S", "Answer", "Call", "Loss", "burst", "client", "draw_calls", "extras"]
