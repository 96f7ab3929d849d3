"""The bus's three queue handlers: what one claimed batch of each queue turns into.

* ``msgbus.system.local``: validate, fan out per destination (uid
  ``dst.counter``), write the backlog and expiry, answer failures on ``ret``,
  route to this twin's remote queue or to HTTP (the backlog entry is the
  durable copy a restart resends).
* ``msgbus.system.remote``: hand each request to ``msgbus.$cmd`` (requests for
  this same twin; a peer's requests skip this queue, see :mod:`pipeline.bus.http`).
* ``msgbus.system.reply``: a reply for this twin goes to its caller's ``ret``
  (once: see :meth:`BusStore.finish`); one for another twin to the outbox.

Each batch ends in one MULTI transaction that also releases the batch from
the queue's inflight list, so a crash replays a batch rather than losing it;
the transaction is fenced (:meth:`BusStore.fenced`): a bus that lost its lease
to another writes nothing.
Nothing one message holds can fail the batch: pushes to client-named keys
are type-checked in Lua (see :class:`BusStore`), and what cannot be answered
or delivered goes to the dead-letter list (:mod:`pipeline.bus.dead`) with
its reason instead of being dropped.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, cast

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import answers, envelope
from pipeline.bus.config import BusConfig
from pipeline.bus.directory import Directory
from pipeline.bus.envelope import Envelope
from pipeline.bus.forward import Forwarder
from pipeline.bus.outbound import Kind, Outbound
from pipeline.bus.store import BusStore
from pipeline.errors import EnvelopeError
from pipeline.loggate import LogGate
from pipeline.redisio.durability import Durability

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _LocalBatch:
    """What one batch of ``msgbus.system.local`` turns into, step by step."""

    #: (ret, answer) pushed in the batch's transaction: refusals and invalid requests.
    answered: list[tuple[str, bytes]] = field(default_factory=list)
    #: (reason, request) set aside: no ``ret`` to answer on.
    unanswerable: list[tuple[str, bytes]] = field(default_factory=list)
    #: (request, deadline, destination) that go on, one per destination.
    routed: list[tuple[Envelope, float, int]] = field(default_factory=list)
    #: Requests for other twins, POSTed once the transaction holds their backlog.
    outbound: list[Outbound] = field(default_factory=list)
    #: (uid, request, deadline): the durable copy a restart resends.
    backlog: list[tuple[str, bytes, float]] = field(default_factory=list)
    #: Requests for this twin, for its remote queue.
    to_self: list[bytes] = field(default_factory=list)
    #: What each answer of ``answered`` says happened ("expired", "refused").
    counted: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _ReplyBatch:
    """What one batch of ``msgbus.system.reply`` turns into, step by step."""

    #: Replies for this twin's callers, matched with their backlog entries.
    mine: list[Envelope] = field(default_factory=list)
    #: Replies for other twins, to the outbox and POSTed.
    outbound: list[Outbound] = field(default_factory=list)
    #: (uid, error) of garbage a handler sent for this twin's callers.
    invalid: list[tuple[str, str]] = field(default_factory=list)
    #: (reason, reply) set aside: no uid or destination to answer.
    unanswerable: list[tuple[str, bytes]] = field(default_factory=list)


class QueueHandlers:
    def __init__(
        self,
        *,
        config: BusConfig,
        client: aioredis.Redis,
        store: BusStore,
        directory: Directory,
        forwarder: Forwarder,
        durability: Durability | None = None,
    ) -> None:
        self.config = config
        #: Replicas that must hold a batch's backlog before its requests leave this twin.
        self.durability = durability or Durability()
        #: Requests that left although fewer replicas than required held their backlog.
        self.not_replicated = 0
        #: Answers to this twin's callers made here: "answered", "handler_failed" (its own
        #: handlers' replies), "expired", "refused" (requests it could not take).
        self.answers: collections.Counter[str] = collections.Counter()
        self._gate = LogGate(log)
        self.twin = config.twin
        self.redis = client
        self.store = store
        self.directory = directory
        self.forwarder = forwarder
        self._counters = UidCounters(client)

    async def local(self, batch: list[bytes], claim_next: int = 0) -> list[bytes]:
        """Handle one claimed batch; returns the next batch (up to ``claim_next``),
        claimed in the transaction that records this one's outcome."""
        now = time.time()
        plan = _LocalBatch()
        for raw in batch:
            env = self._read_request(raw, now, plan)
            if env is not None:
                await self._route(env, now, plan)
        for env, expires, dst in plan.routed:
            await self._stamp(env, expires, dst, plan)
        async with self.store.fenced() as pipe:
            await self._record_local_in(pipe, plan)
            self.store.release(pipe, keys.BUS_LOCAL, len(batch), claim_next)
            results = await pipe.execute()
        self.answers.update(plan.counted)
        if self.durability.on and (plan.backlog or plan.answered):
            await self._wait_replicated(len(plan.backlog))
        for item in plan.outbound:
            await self.forwarder.submit(item)
        return _claimed(results, claim_next)

    def _read_request(self, raw: bytes, now: float, plan: _LocalBatch) -> Envelope | None:
        """The request a client wrote, or None when it is invalid: then it is answered
        on its ``ret`` when that much can be read, else set aside."""
        try:
            return envelope.decode(raw, client=True, max_size=self.config.max_size)
        except EnvelopeError as exc:
            ret, cmd = envelope.salvage(raw, max_size=self.config.max_size)
            if not ret:
                log.warning("bus: unanswerable request (no ret) set aside: %s", exc)
                plan.unanswerable.append((f"{exc.public_message} (no usable ret)", raw))
                return None
            log.info("bus: invalid request answered on %s: %s", ret, exc)
            bad = Envelope(cmd=cmd, ret=ret, dst=[self.twin], now=int(now))
            plan.answered.append((ret, bad.copy(err=exc.public_message).encode()))
            plan.counted.append("refused")
            return None

    async def _route(self, env: Envelope, now: float, plan: _LocalBatch) -> None:
        """Fan ``env`` out per destination: routed, or answered at once with why not."""
        expires = envelope.deadline(
            env,
            received=now,
            default_exp=self.config.default_exp_s,
            max_exp=self.config.max_exp_s,
        )
        for dst in env.dst:
            if expires <= now:
                problem = "request expired"
            elif dst != self.twin and await self.directory.lookup(dst) is None:
                problem = "destination not found"
            else:
                plan.routed.append((env, expires, dst))
                continue
            about = env.copy(dst=[dst], src=self.twin)
            fail = answers.error_reply(about, problem, about=dst, me=self.twin)
            plan.answered.append((env.ret, fail.encode()))
            plan.counted.append("expired" if problem == "request expired" else "refused")

    async def _stamp(self, env: Envelope, expires: float, dst: int, plan: _LocalBatch) -> None:
        """Give one routed copy its uid and its backlog entry; queue it for this twin's
        remote queue or for HTTP."""
        uid = f"{dst}.{await self._counters.next(dst)}"
        tries = min(env.try_, self.config.max_try)
        request = env.encode(uid=uid, src=self.twin, dst=[dst], try_=tries)
        plan.backlog.append((uid, request, expires))
        if dst == self.twin:
            plan.to_self.append(env.encode(uid=uid, src=self.twin, dst=[dst], ret=keys.BUS_REPLY))
            return
        # The backlog entry is its durable copy (resent after a restart).
        plan.outbound.append(
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

    async def _record_local_in(self, pipe: Any, plan: _LocalBatch) -> None:
        """Queue the batch's answers, set-asides, backlog and own requests into ``pipe``."""
        if plan.answered:
            await self.store.push_in(pipe, "answer not delivered", plan.answered)
        for reason, raw in plan.unanswerable:
            self.store.bury_in(pipe, keys.BUS_LOCAL, reason, raw)
        if plan.backlog:
            self.store.record_in(pipe, plan.backlog)
        if plan.to_self:
            pipe.rpush(keys.BUS_REMOTE, *plan.to_self)

    async def _wait_replicated(self, requests: int) -> None:
        """``WAIT`` for the replicas (``SLUICE_REDIS_MIN_REPLICAS``) before requests leave:
        a request whose backlog entry died with the master would be answered by no one.
        When fewer replicas took it, the requests still go (the master holds them; holding
        them back would not undo the write): counted, and logged at most every 10 s."""
        failure = await self.store.replicated(self.durability)
        if failure is None:
            self._gate.ended("replicas", "bus: requests held by enough replicas again")
            return
        self.not_replicated += requests
        self._gate.failed(
            "replicas",
            "bus: %d requests sent before enough replicas held them (%s); "
            "%d so far: they are lost if the master dies before its replicas catch up",
            requests,
            failure,
            self.not_replicated,
        )

    async def remote(self, batch: list[bytes], claim_next: int = 0) -> list[bytes]:
        """As :meth:`local`, for ``msgbus.system.remote``."""
        pushes: list[tuple[str, bytes]] = []
        unreadable: list[bytes] = []
        for raw in batch:
            # Entries were validated on the way in (HTTP or local loop); only cmd is needed.
            cmd = self._command_of(raw)
            if cmd:
                pushes.append((keys.bus_command(cmd), raw))
            else:
                log.warning("bus: entry of %s without a valid cmd set aside", keys.BUS_REMOTE)
                unreadable.append(raw)
        async with self.store.fenced() as pipe:
            if pushes:
                await self.store.push_in(pipe, "request not delivered", pushes)
            for raw in unreadable:
                self.store.bury_in(pipe, keys.BUS_REMOTE, "no valid cmd", raw)
            self.store.release(pipe, keys.BUS_REMOTE, len(batch), claim_next)
            results = await pipe.execute()
        aside = [pushes[int(i)] for i in results[0]] if pushes else []
        if aside:
            # The handler's queue is not a list: its callers hear it now, not at expiry.
            await self._refuse(aside)
        return _claimed(results, claim_next)

    async def _refuse(self, aside: list[tuple[str, bytes]]) -> None:
        replies: list[bytes] = []
        for queue, raw in aside:
            try:
                request = envelope.decode(raw, max_size=self.config.max_size)
            except EnvelopeError:
                continue  # already in the dead-letter list
            log.error("bus: %s is not a list; request %s refused", queue, request.uid)
            text = f"command queue of {request.cmd} unavailable"
            replies.append(answers.refusal(request, text, me=self.twin).encode())
        if replies:
            await self.redis.rpush(keys.BUS_REPLY, *replies)

    def _command_of(self, raw: bytes) -> str:
        try:
            doc = envelope.loads(raw, max_size=self.config.max_size)
        except EnvelopeError:
            return ""
        cmd = doc.get("cmd") if isinstance(doc, dict) else None
        return str(cmd) if envelope.valid_cmd(cmd) else ""

    async def reply(self, batch: list[bytes], claim_next: int = 0) -> list[bytes]:
        """As :meth:`local`, for ``msgbus.system.reply``."""
        now = time.time()
        plan = _ReplyBatch()
        for raw in batch:
            env = self._read_reply(raw, now, plan)
            if env is None:
                continue
            if env.dst[0] == self.twin:
                plan.mine.append(env)
            else:
                plan.outbound.append(self._outbound_reply(env, now))
        uids = [env.uid for env in plan.mine] + [uid for uid, _ in plan.invalid]
        originals = await self.store.backlog(uids)
        async with self.store.fenced() as pipe:
            counted: list[str] = []  # what each caller answered got, once it is written
            await self._answer_in(pipe, plan.mine, originals, counted)
            await self._fail_in(pipe, plan.invalid, originals[len(plan.mine) :], counted)
            for reason, raw in plan.unanswerable:
                self.store.bury_in(pipe, keys.BUS_REPLY, reason, raw)
            if plan.outbound:
                self.store.outbox_in(pipe, [(item.id, item.to_json()) for item in plan.outbound])
            self.store.release(pipe, keys.BUS_REPLY, len(batch), claim_next)
            results = await pipe.execute()
        self.answers.update(counted)
        self.forwarder.answered(uids)  # matched: no pending copy of them goes out again
        for item in plan.outbound:
            await self.forwarder.submit(item)
        return _claimed(results, claim_next)

    def _read_reply(self, raw: bytes, now: float, plan: _ReplyBatch) -> Envelope | None:
        """The reply a handler wrote; when it is garbage, the error reply its caller
        gets instead (None when that caller is this twin's, or unknown)."""
        try:
            return envelope.decode(raw, reply=True, max_size=self.config.max_size)
        except EnvelopeError as exc:
            # A handler sent garbage: its caller still gets an answer, with err.
            uid, to, cmd = self._salvage_reply(raw)
            log.warning("bus: invalid reply %r for twin %s: %s", uid, to, exc)
            if not uid or to is None:
                plan.unanswerable.append((f"invalid reply without uid or dst: {exc}", raw))
                return None
            if to == self.twin:
                plan.invalid.append((uid, exc.public_message))
                return None
            return Envelope(
                uid=uid,
                cmd=cmd,
                src=self.twin,
                dst=[to],
                ret=keys.BUS_REPLY,
                now=int(now),
                err=f"invalid reply: {exc.public_message}",
            )

    def _outbound_reply(self, env: Envelope, now: float) -> Outbound:
        """A reply for another twin, as the outbox item POSTed to its ``/zbus-reply``."""
        exp = min(env.exp or self.config.default_exp_s, self.config.max_exp_s)
        return Outbound(
            due=0.0,
            id=f"reply:{env.dst[0]}:{env.uid}",
            kind=Kind.REPLY,
            to=env.dst[0],
            body=env.encode(),
            deadline=now + exp,
            tries=self.config.max_try,
            uid=env.uid,
        )

    async def _answer_in(
        self, pipe: Any, mine: list[Envelope], originals: list[bytes | None], counted: list[str]
    ) -> None:
        """Queue into ``pipe`` the answers to this twin's callers, each on its request's ``ret``."""
        for env, original in zip(mine, originals, strict=False):
            if original is None:
                log.warning("bus: reply %s matches no pending request (late?)", env.uid)
                continue
            try:
                request = envelope.load_trusted(original)
            except EnvelopeError:
                self.corrupt_in(pipe, env.uid, original)
                continue
            answer = env.encode(ret=request.ret)
            await self.store.finish_in(pipe, env.uid, request.ret, answer)
            counted.append("handler_failed" if env.err else "answered")

    async def _fail_in(
        self,
        pipe: Any,
        invalid: list[tuple[str, str]],
        originals: list[bytes | None],
        counted: list[str],
    ) -> None:
        """Queue into ``pipe`` the error answers for this twin's callers whose handler
        replied with garbage."""
        for (uid, text), original in zip(invalid, originals, strict=True):
            if original is None:
                continue
            try:
                request = envelope.load_trusted(original)
            except EnvelopeError:
                self.corrupt_in(pipe, uid, original)
                continue
            fail = answers.error_reply(
                request, f"invalid reply: {text}", about=request.dst[0], me=self.twin
            )
            await self.store.finish_in(pipe, uid, request.ret, fail.encode())
            counted.append("handler_failed")

    def corrupt_in(self, pipe: Any, uid: str, original: bytes) -> None:
        """Set aside a backlog entry that does not decode (written by something else)."""
        log.error("bus: corrupt backlog entry %s set aside", uid)
        pipe.hdel(keys.BUS_BACKLOG, uid)
        pipe.zrem(keys.bus_expiry(), uid)
        self.store.bury_in(pipe, keys.BUS_BACKLOG, f"corrupt backlog entry {uid}", original)

    def _salvage_reply(self, raw: bytes) -> tuple[str, int | None, str]:
        """``(uid, destination twin, cmd)`` of a reply that failed validation, where readable."""
        try:
            doc = envelope.loads(raw, max_size=self.config.max_size)
        except EnvelopeError:
            return "", None, ""
        uid = doc.get("uid") if isinstance(doc, dict) else None
        if not isinstance(uid, str) or not uid or len(uid) > envelope.MAX_NAME:
            return "", None, ""
        dst = doc.get("dst")
        if isinstance(dst, list) and len(dst) == 1:
            dst = dst[0]
        to = dst if envelope.is_twin(dst) else None
        cmd = doc.get("cmd")
        return uid, to, str(cmd) if envelope.valid_cmd(cmd) else "invalid.reply"


def _claimed(results: list[Any], claim_next: int) -> list[bytes]:
    """The next batch a transaction claimed (its last result, see ``BusStore.release``)."""
    return cast(list[bytes], results[-1]) if claim_next > 0 else []


class UidCounters:
    """Per-destination counters for uids ``dst.counter``, reserved from Redis in blocks.

    ``INCRBY msgbus.system.counter.<dst> BLOCK`` reserves the next BLOCK values,
    handed out from memory; a restart skips the rest of a block, so uids stay
    unique (with gaps) without a Redis round trip per request.

    The counter never goes below the current time in microseconds: a sender
    whose Redis lost the counter (wiped, or a crash that rolled back an RDB
    snapshot) goes on above every uid it issued before instead of reusing
    them, which its peers would refuse as replayed for the whole replay window.
    """

    BLOCK = 100
    MAX_TWINS = 10_000
    #: INCRBY, lifted to ARGV[2] + BLOCK first when the counter is below that floor.
    _RESERVE = """
local top = redis.call('INCRBY', KEYS[1], ARGV[1])
if top < tonumber(ARGV[2]) then
  top = tonumber(ARGV[2]) + tonumber(ARGV[1])
  redis.call('SET', KEYS[1], top)
end
return top
"""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._ranges: dict[int, list[int]] = {}  # dst -> [next, end)
        self._reserve = client.register_script(self._RESERVE)

    async def next(self, dst: int) -> int:
        span = self._ranges.get(dst)
        if span is None or span[0] >= span[1]:
            floor = time.time_ns() // 1000
            top = int(await self._reserve(keys=[keys.bus_counter(dst)], args=[self.BLOCK, floor]))
            if len(self._ranges) >= self.MAX_TWINS:
                self._ranges.clear()
            span = self._ranges[dst] = [top - self.BLOCK + 1, top + 1]
        value = span[0]
        span[0] += 1
        return value
