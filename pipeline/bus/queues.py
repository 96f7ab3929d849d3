"""The bus's three queue handlers: what one claimed batch of each queue turns into.

* ``msgbus.system.local``: validate, fan out per destination (uid
  ``dst.counter``), write the backlog and expiry, answer failures on ``ret``,
  route to this twin's remote queue or to HTTP (the backlog entry is the
  durable copy a restart resends).
* ``msgbus.system.remote``: hand each request to ``msgbus.$cmd``.
* ``msgbus.system.reply``: a reply for this twin goes to its caller's ``ret``
  (once: see :meth:`BusStore.finish`); one for another twin to the outbox.

Each batch ends in one MULTI transaction that also releases the batch from
the queue's inflight list, so a crash replays a batch rather than losing it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import envelope
from pipeline.bus.config import BusConfig
from pipeline.bus.directory import Directory
from pipeline.bus.envelope import Envelope
from pipeline.bus.forward import Forwarder, Kind, Outbound
from pipeline.bus.store import BusStore
from pipeline.errors import EnvelopeError

log = logging.getLogger(__name__)


class QueueHandlers:
    def __init__(
        self,
        *,
        config: BusConfig,
        client: aioredis.Redis,
        store: BusStore,
        directory: Directory,
        forwarder: Forwarder,
    ) -> None:
        self.config = config
        self.twin = config.twin
        self.redis = client
        self.store = store
        self.directory = directory
        self.forwarder = forwarder
        self._counters = UidCounters(client)

    async def local(self, batch: list[bytes]) -> None:
        now = time.time()
        answers: list[tuple[str, bytes]] = []  # (ret, answer) pushed right away
        routed: list[tuple[Envelope, float, int]] = []  # (request, deadline, destination)
        for raw in batch:
            try:
                env = envelope.decode(raw, max_size=self.config.max_size)
            except EnvelopeError as exc:
                ret, cmd = envelope.salvage(raw)
                if not ret:
                    log.warning("bus: dropped unreadable request (no ret): %s", exc)
                    continue
                log.info("bus: invalid request answered on %s: %s", ret, exc)
                bad = Envelope(cmd=cmd, ret=ret, dst=[self.twin], now=int(now))
                answers.append((ret, bad.copy(err=exc.public_message).encode()))
                continue
            expires = envelope.deadline(
                env, received=now, default_exp=self.config.default_exp, max_exp=self.config.max_exp
            )
            for dst in env.dst:
                if expires <= now:
                    problem = "request expired"
                elif dst != self.twin and await self.directory.lookup(dst) is None:
                    problem = "destination not found"
                else:
                    routed.append((env, expires, dst))
                    continue
                about = env.copy(dst=[dst], src=self.twin)
                fail = envelope.error_reply(about, problem, about=dst, me=self.twin)
                answers.append((env.ret, fail.encode()))
        outbound: list[Outbound] = []
        backlog: dict[str, bytes] = {}
        deadlines: dict[str, float] = {}
        to_self: list[bytes] = []
        for env, expires, dst in routed:
            uid = f"{dst}.{await self._counters.next(dst)}"
            tries = min(env.try_, self.config.max_try)
            request = env.copy(uid=uid, src=self.twin, dst=[dst], try_=tries).encode()
            backlog[uid] = request
            deadlines[uid] = expires
            if dst == self.twin:
                local = env.copy(uid=uid, src=self.twin, dst=[dst], ret=keys.BUS_REPLY)
                to_self.append(local.encode())
            else:
                # The backlog entry is its durable copy (resent after a restart).
                outbound.append(
                    Outbound(
                        due=0.0,
                        id=f"req:{uid}",
                        kind=Kind.REQUEST,
                        to=dst,
                        body=request,
                        deadline=expires,
                        tries=tries,
                        uid=uid,
                    )
                )
        async with self.redis.pipeline(transaction=True) as pipe:
            for ret, answer in answers:
                pipe.rpush(ret, answer)
            if backlog:
                pipe.hset(keys.BUS_BACKLOG, mapping=backlog)  # type: ignore[arg-type]
                pipe.zadd(keys.bus_expiry(), deadlines)
            if to_self:
                pipe.rpush(keys.BUS_REMOTE, *to_self)
            self.store.release(pipe, keys.BUS_LOCAL, len(batch))
            await pipe.execute()
        for item in outbound:
            await self.forwarder.submit(item)

    async def remote(self, batch: list[bytes]) -> None:
        by_cmd: dict[str, list[bytes]] = {}
        for raw in batch:
            # Entries were validated on the way in (HTTP or local loop); only cmd is needed.
            cmd = _command_of(raw)
            if not cmd:
                log.warning("bus: dropped an entry of %s without a valid cmd", keys.BUS_REMOTE)
                continue
            by_cmd.setdefault(cmd, []).append(raw)
        async with self.redis.pipeline(transaction=True) as pipe:
            for cmd, items in by_cmd.items():
                pipe.rpush(keys.bus_command(cmd), *items)
            self.store.release(pipe, keys.BUS_REMOTE, len(batch))
            await pipe.execute()

    async def reply(self, batch: list[bytes]) -> None:
        mine: list[Envelope] = []
        outbound: list[Outbound] = []
        invalid: list[tuple[str, str]] = []  # (uid, error) of unparseable replies
        now = time.time()
        for raw in batch:
            try:
                env = envelope.decode(raw, reply=True, max_size=self.config.max_size)
            except EnvelopeError as exc:
                # A handler sent garbage: its caller still gets an answer, with err.
                uid, to, cmd = _salvage_reply(raw)
                log.warning("bus: invalid reply %r for twin %s: %s", uid, to, exc)
                if not uid or to is None:
                    continue
                if to == self.twin:
                    invalid.append((uid, exc.public_message))
                    continue
                env = Envelope(
                    uid=uid,
                    cmd=cmd,
                    src=self.twin,
                    dst=[to],
                    ret=keys.BUS_REPLY,
                    now=int(now),
                    err=f"invalid reply: {exc.public_message}",
                )
            if env.dst[0] == self.twin:
                mine.append(env)
            else:
                exp = min(env.exp or self.config.default_exp, self.config.max_exp)
                outbound.append(
                    Outbound(
                        due=0.0,
                        id=f"reply:{env.dst[0]}:{env.uid}",
                        kind=Kind.REPLY,
                        to=env.dst[0],
                        body=env.encode(),
                        deadline=now + exp,
                        tries=self.config.max_try,
                        uid=env.uid,
                    )
                )
        uids = [env.uid for env in mine] + [uid for uid, _ in invalid]
        originals = await self.store.backlog(uids)
        async with self.redis.pipeline(transaction=True) as pipe:
            for env, original in zip(mine, originals, strict=False):
                if original is None:
                    log.warning("bus: reply %s matches no pending request (late?)", env.uid)
                    continue
                request = envelope.load_trusted(original)
                answer = env.copy(ret=request.ret).encode()
                await self.store.finish_in(pipe, env.uid, request.ret, answer)
            for (uid, text), original in zip(invalid, originals[len(mine) :], strict=True):
                if original is None:
                    continue
                request = envelope.load_trusted(original)
                fail = envelope.error_reply(
                    request, f"invalid reply: {text}", about=request.dst[0], me=self.twin
                )
                await self.store.finish_in(pipe, uid, request.ret, fail.encode())
            if outbound:
                pending = {item.id: item.to_json() for item in outbound}
                pipe.hset(keys.bus_outbox(), mapping=pending)  # type: ignore[arg-type]
            self.store.release(pipe, keys.BUS_REPLY, len(batch))
            await pipe.execute()
        for item in outbound:
            await self.forwarder.submit(item)


class UidCounters:
    """Per-destination counters for uids ``dst.counter``, reserved from Redis in blocks.

    ``INCRBY msgbus.system.counter.<dst> BLOCK`` reserves the next BLOCK values,
    handed out from memory; a restart skips the rest of a block, so uids stay
    unique (with gaps) without a Redis round trip per request.
    """

    BLOCK = 100
    MAX_TWINS = 10_000

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._ranges: dict[int, list[int]] = {}  # dst -> [next, end)

    async def next(self, dst: int) -> int:
        span = self._ranges.get(dst)
        if span is None or span[0] >= span[1]:
            top = int(await self._redis.incrby(keys.bus_counter(dst), self.BLOCK))
            if len(self._ranges) >= self.MAX_TWINS:
                self._ranges.clear()
            span = self._ranges[dst] = [top - self.BLOCK + 1, top + 1]
        value = span[0]
        span[0] += 1
        return value


def _command_of(raw: bytes) -> str:
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        doc = json.loads(raw)
        cmd = doc.get("cmd") if isinstance(doc, dict) else None
        if envelope.valid_cmd(cmd):
            return str(cmd)
    return ""


def _salvage_reply(raw: bytes) -> tuple[str, int | None, str]:
    """``(uid, destination twin, cmd)`` of a reply that failed validation, where readable."""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        doc = json.loads(raw)
        if isinstance(doc, dict) and isinstance(doc.get("uid"), str):
            dst = doc.get("dst")
            if isinstance(dst, list) and len(dst) == 1:
                dst = dst[0]
            to = dst if isinstance(dst, int) and not isinstance(dst, bool) else None
            cmd = doc.get("cmd")
            return doc["uid"], to, str(cmd) if envelope.valid_cmd(cmd) else "invalid.reply"
    return "", None, ""
