"""The bus's Redis operations, each one atomic (Lua or MULTI), so a crash never loses work.

* Queues are consumed by *claiming*: items move from the queue to its
  ``.inflight`` list in one step and leave it only in the same transaction
  that writes their outcome (backlog, outbox, answers). After a crash the
  inflight list is simply processed again.
* :meth:`BusStore.finish` answers a backlog request at most once: whoever
  removes the backlog entry (reply, expiry scrubber, failed forwarding)
  pushes the one answer; the others find it gone and push nothing.
* Every push to a key a client named (``ret``) or to a handler's queue goes
  through a type check in the same script: a key that is not a list gets no
  push (no ``WRONGTYPE`` that would fail the rest of a batched write); the
  message goes to the dead-letter list instead (:mod:`pipeline.bus.dead`).

The scripts themselves, with their KEYS and ARGV, are :mod:`pipeline.bus.scripts`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import msgspec
import redis.asyncio as aioredis
import redis.exceptions

from pipeline import keys
from pipeline.bus import dead, lease, scripts
from pipeline.bus.coalesce import Coalescer
from pipeline.bus.lease import FENCE
from pipeline.errors import Fenced, NotReplicated
from pipeline.redisio.durability import Durability


def _packed(values: Sequence[str | bytes]) -> bytes:
    """``values`` as one msgpack array of strings, for a script's ``cmsgpack.unpack``.

    Redis's Lua msgpack reads strings, not msgpack's binary type, so bytes go as
    strings: every body the bus passes is its own JSON encoding (ASCII), which
    decodes and encodes back to the same bytes; anything else is a bug (ValueError).
    """
    return _PACK([v.decode() if type(v) is bytes else v for v in values])


_PACK = msgspec.msgpack.Encoder().encode

#: When the replay memory (the seen set) began, in ms (see ``scripts.STALE``).
SEEN_EPOCH = "msgbus.system.seen.epoch"

#: Attempt counts outlive no restart loop: the hash expires a day after its last write.
ATTEMPTS_TTL_S = 86400


class BusStore:
    """Typed wrappers around the bus's Redis commands and scripts."""

    def __init__(
        self, client: aioredis.Redis, *, max_seen: int = 2_000_000, max_item: int = 1 << 20
    ) -> None:
        self.redis = client
        self.max_seen = max_seen
        #: Items longer than this reach the bus cut to ``max_item + 1 + 4096`` bytes (see CLAIM).
        self.max_item = max_item
        #: Single commands from concurrent callers go through here; run it as a task.
        self.coalescer = Coalescer(client, reload=self._load_scripts)
        #: The fencing token of the lease this bus holds ('' when it holds none or runs
        #: without one): the claims, batch transactions and answers check it.
        self.token = ""
        self._claim = client.register_script(scripts.CLAIM)
        self._fenced_claim = client.register_script(scripts.FENCED_CLAIM)
        self._peek = client.register_script(scripts.PEEK)
        self._accept_requests = client.register_script(scripts.ACCEPT_REQUESTS)
        self._finish = client.register_script(scripts.FINISH)
        self._deliver_replies = client.register_script(scripts.DELIVER_REPLIES)
        self._push = client.register_script(scripts.PUSH)
        self._bury_head = client.register_script(scripts.BURY_HEAD)

    async def _load_scripts(self) -> None:
        """Load the scripts the coalescer runs by EVALSHA (after Redis lost its script cache)."""
        for script in (
            self._accept_requests,
            self._deliver_replies,
            self._finish,
            self._fenced_claim,
        ):
            await self.redis.script_load(script.script)

    async def replicated(self, durability: Durability) -> NotReplicated | None:
        """Wait until ``durability.min_replicas`` replicas hold every write made so far.

        A transaction's ``WAIT`` cannot follow it on its connection through redis-py's
        pool (the pipeline releases the connection at ``EXEC``), and a ``WAIT`` on a
        connection that wrote nothing returns at once. Replication is one ordered stream:
        a replica that acknowledged this later increment holds every earlier write, the
        caller's transaction included. None when enough replicas took it, else the error.
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.incr(keys.bus_replicated())
            durability.add_waits(pipe, self.redis, [keys.bus_replicated()])
            marked, *acks = await pipe.execute(raise_on_error=False)
        if isinstance(marked, BaseException):
            return NotReplicated(f"replication mark failed: {marked!r}")
        return durability.check(acks)

    @contextlib.asynccontextmanager
    async def fenced(self) -> AsyncIterator[Any]:
        """A MULTI pipeline that writes only while this bus's token is the fence's.

        With a token: ``WATCH`` the fence, read it (:class:`Fenced` when it is not
        the token), then ``MULTI``; an ``EXEC`` after another bus took the lease is
        discarded by Redis and raises :class:`Fenced`. Without one, a plain MULTI.
        """
        async with self.redis.pipeline(transaction=True) as pipe:
            if self.token:
                await pipe.watch(FENCE)
                current = await pipe.get(FENCE)
                if current != self.token.encode():
                    raise Fenced(f"fencing token {self.token} superseded by {current!r}")
                pipe.multi()  # type: ignore[no-untyped-call]
            try:
                yield pipe
            except redis.exceptions.WatchError as exc:
                raise Fenced(f"the lease of token {self.token} was taken over") from exc

    async def start_epoch(self) -> None:
        """Begin the replay memory's epoch now unless it has one (see ``scripts.STALE``):
        at start, so that POSTs signed after it are not refused on first contact."""
        await self.redis.eval(scripts.STALE + "stale(KEYS[1], '0')", 1, SEEN_EPOCH)

    async def wait_claim(self, queue: str, block_s: int, count: int) -> list[bytes]:
        """Block up to ``block_s`` seconds for one item, then claim up to ``count - 1`` more.

        Both in one round trip (a pipeline: Redis runs the claim as soon as the
        blocking move is served), every item moved atomically to the inflight list.
        Empty when nothing came. The first item arrives whole (BLMOVE cannot cut
        it): at most one oversized item is in the bus's memory at a time, bounded
        by Redis's ``proto-max-bulk-len``; the others are cut like :meth:`claim`'s.
        """
        if self.token:
            return await self._wait_claim_fenced(queue, block_s, count)
        inflight = keys.bus_inflight(queue)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.blmove(queue, inflight, block_s, "LEFT", "RIGHT")
            if count > 1:
                limit = self.max_item + 1
                pipe.evalsha(self._claim.sha, 2, queue, inflight, count - 1, limit)
            results = await pipe.execute(raise_on_error=False)
        first = results[0]
        if isinstance(first, BaseException):
            raise first
        if first is None:
            return []
        more = results[1] if count > 1 else []
        if isinstance(more, redis.exceptions.NoScriptError):
            # Redis does not hold the script (yet, or lost it in a restart): the claim
            # loads it, one more trip this once.
            more = await self.claim(queue, count - 1)
        elif isinstance(more, BaseException):
            raise more  # the first item is in the inflight list: the loop recovers it
        return [cast(bytes, first), *cast(list[bytes], more)]

    async def _wait_claim_fenced(self, queue: str, block_s: int, count: int) -> list[bytes]:
        """:meth:`wait_claim` of a lease holder: the BLMOVE (which no script can run)
        moves the first item to the queue's staging list; a script moves it on to the
        inflight list, with up to ``count - 1`` more, only while the token is the
        fence's. Same one round trip; what a bus that lost the lease claimed stops in
        the staging list, and the owner's next claim (within ``block_s``) takes it."""
        staging = lease.staging(queue)
        names = [FENCE, staging, queue, keys.bus_inflight(queue)]
        args: list[str | int] = [self.token, count - 1, self.max_item + 1]
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.blmove(queue, staging, block_s, "LEFT", "RIGHT")
            pipe.evalsha(self._fenced_claim.sha, 4, *names, *args)
            first, items = await pipe.execute(raise_on_error=False)
        if isinstance(first, BaseException):
            raise first
        if isinstance(items, redis.exceptions.NoScriptError):
            items = await self._fenced_claim(keys=names, args=args)
        elif isinstance(items, redis.exceptions.ResponseError) and "FENCED" in str(items):
            raise Fenced(str(items))
        elif isinstance(items, BaseException):
            raise items  # the first item is in the staging list: the next claim takes it
        return cast(list[bytes], items)

    async def claim(self, queue: str, count: int) -> list[bytes]:
        """Move up to ``count`` more items from ``queue`` to its inflight list."""
        args = [count, self.max_item + 1]
        items = await self._claim(keys=[queue, keys.bus_inflight(queue)], args=args)
        return cast(list[bytes], items)

    async def inflight(self, queue: str, count: int) -> list[bytes]:
        """Items left in the inflight list (by a crash or a failed transaction), cut like claims."""
        items = await self._peek(keys=[keys.bus_inflight(queue)], args=[count, self.max_item + 1])
        return cast(list[bytes], items)

    def release(self, pipe: Any, queue: str, count: int, claim_next: int = 0) -> None:
        """Queue the removal of the first ``count`` inflight items into ``pipe``.

        With ``claim_next``, the same transaction then claims up to that many
        more items (as :meth:`claim`: the pipeline's last result is the list), so
        a busy loop's next batch costs no round trip of its own. The script goes
        by its text (EVAL): a transaction has no second chance at ``NOSCRIPT``.
        """
        inflight = keys.bus_inflight(queue)
        pipe.ltrim(inflight, count, -1)
        if claim_next > 0:
            pipe.eval(scripts.CLAIM, 2, queue, inflight, claim_next, self.max_item + 1)

    def record_in(self, pipe: Any, requests: Sequence[tuple[str, bytes, float]]) -> None:
        """Queue into ``pipe`` the backlog entries ``(uid, request, deadline)`` of a batch
        (``msgbus.system.backlog`` and the expiry set, one packed argument: see _packed).
        By its text (EVAL): a transaction has no second chance at ``NOSCRIPT``."""
        flat: list[str | bytes] = []
        for uid, request, deadline in requests:
            flat += [uid, request, repr(deadline)]
        pipe.eval(scripts.RECORD, 2, keys.BUS_BACKLOG, keys.bus_expiry(), _packed(flat))

    def outbox_in(self, pipe: Any, items: Sequence[tuple[str, bytes]]) -> None:
        """Queue into ``pipe`` the outbox entries ``(id, entry)`` (one packed argument)."""
        flat = [value for item in items for value in item]
        pipe.eval(scripts.HSET, 1, keys.bus_outbox(), _packed(flat))

    async def accept_request(
        self, seen_id: str, forget_at: float, queue: str, body: bytes, signed_ms: str = ""
    ) -> int:
        """RPUSH a request from a peer to ``queue`` unless ``seen_id`` was seen (until ``forget_at``).

        1 queued, 0 a replay, -1 the seen set holds ``max_seen`` ids already, 2 set
        aside because ``queue`` is not a list (see :meth:`accept_requests`).
        """
        [result] = await self.accept_requests([(seen_id, queue, body)], forget_at, signed_ms)
        return result

    async def accept_requests(
        self, requests: Sequence[tuple[str, str, bytes]], forget_at: float, signed_ms: str = ""
    ) -> list[int]:
        """:meth:`accept_request` for ``(seen id, queue, body)`` triples, in one Redis step.

        The queue is the handler's own (``msgbus.$cmd``): a request from a peer
        skips ``msgbus.system.remote`` and the loop behind it (one Redis hop less
        per request), with the same effect as the seed's forward "as it is".
        """
        if not requests:
            return []
        flat: list[str | bytes] = []
        for seen_id, queue, body in requests:
            flat += [seen_id, queue, body]
        args = [forget_at, self.max_seen, _packed(flat), signed_ms]
        sha = self._accept_requests.sha
        seen = [keys.bus_seen(), SEEN_EPOCH]
        result = await self.coalescer.call(lambda pipe: pipe.evalsha(sha, 2, *seen, *args))
        return [int(r) for r in result]

    async def push_in(self, pipe: Any, why: str, pushes: Sequence[tuple[str, bytes]]) -> None:
        """Queue RPUSHes to client-named keys into ``pipe``; a non-list target is set aside.

        The command's result is the list of indexes (into ``pushes``) set aside.
        """
        args: list[str | bytes] = [why]
        for target, value in pushes:
            args += [target, value]
        await self._push(keys=[], args=args, client=pipe)

    async def attempt(self, queue: str, digest: str, *, count: bool = True) -> tuple[int, str]:
        """Count one more handling attempt of a message (unless not ``count``).

        Returns (attempts so far, last failure).
        """
        field = f"{queue}:{digest}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(keys.bus_attempts(), field, int(count))
            pipe.hget(keys.bus_attempts(), field + ":why")
            pipe.expire(keys.bus_attempts(), ATTEMPTS_TTL_S)
            count, why, _ = await pipe.execute()
        return int(count), (why or b"").decode("utf-8", "replace")

    async def failed(self, queue: str, digest: str, why: str) -> None:
        """Remember why handling of a message failed (for its dead-letter entry)."""
        await self.redis.hset(keys.bus_attempts(), f"{queue}:{digest}:why", why[:1000])

    async def handled(self, queue: str, digest: str) -> None:
        field = f"{queue}:{digest}"
        await self.redis.hdel(keys.bus_attempts(), field, field + ":why")

    async def bury_head(self, queue: str, digest: str, item: bytes, why: str, tries: int) -> None:
        """Move the first inflight item of ``queue`` (``item``) to the dead-letter list."""
        entry = dead.entry(queue, why, item, attempts=tries)
        done = await self._bury_head(
            keys=[keys.bus_inflight(queue), keys.bus_dead(), keys.bus_attempts(), FENCE],
            args=[entry, f"{queue}:{digest}", self.token],
        )
        if not int(done):
            raise Fenced(f"set-aside refused: the lease of token {self.token} was taken over")

    def bury_in(self, pipe: Any, queue: str, why: str, item: bytes) -> None:
        """Queue setting ``item`` aside into ``pipe`` (with the batch that read it)."""
        pipe.lpush(keys.bus_dead(), dead.entry(queue, why, item))
        pipe.ltrim(keys.bus_dead(), 0, dead.LIST_MAX - 1)

    async def deliver_reply(self, uid: str, sender: int, head: bytes, tail: bytes) -> int:
        """Answer the caller of backlog request ``uid`` with a reply from twin ``sender``.

        The answer is ``head + ret + tail`` with the request's own ``ret`` as a
        JSON string, pushed to that ``ret`` in the same step that drops the backlog
        entry, so it happens at most once. Returns 1 answered, 0 unknown (or
        already answered) uid, -1 when the request went to another twin.
        """
        [result] = await self.deliver_replies([(uid, sender, head, tail)])
        return result

    async def deliver_replies(
        self, replies: Sequence[tuple[str, int, bytes, bytes]], signed_ms: str = ""
    ) -> list[int]:
        """:meth:`deliver_reply` for ``(uid, sender, head, tail)`` tuples, in one Redis step
        (-2 each when ``signed_ms`` predates the replay memory's epoch)."""
        if not replies:
            return []
        flat: list[str | bytes] = []
        for uid, sender, head, tail in replies:
            flat += [uid, str(sender), head, tail]
        packed = _packed(flat)
        sha = self._deliver_replies.sha
        names = [keys.BUS_BACKLOG, keys.bus_expiry(), SEEN_EPOCH]
        result = await self.coalescer.call(
            lambda pipe: pipe.evalsha(sha, 3, *names, packed, signed_ms)
        )
        return [int(r) for r in result]

    async def finish_in(
        self, pipe: Any, uid: str, ret: str, answer: bytes, outbox_id: str = ""
    ) -> None:
        """Queue a :meth:`finish` into a pipeline."""
        await self._finish(
            keys=[keys.BUS_BACKLOG, keys.bus_expiry(), keys.bus_outbox(), FENCE],
            args=[uid, ret, answer, outbox_id, self.token],
            client=pipe,
        )

    async def finish(self, uid: str, ret: str, answer: bytes, outbox_id: str = "") -> bool:
        """Push ``answer`` to ``ret`` and drop the backlog entry, unless it is already answered
        (or this bus lost its lease: :class:`Fenced`)."""
        sha = self._finish.sha
        args = [uid, ret, answer, outbox_id, self.token]
        names = [keys.BUS_BACKLOG, keys.bus_expiry(), keys.bus_outbox(), FENCE]
        result = int(await self.coalescer.call(lambda pipe: pipe.evalsha(sha, 4, *names, *args)))
        if result < 0:
            raise Fenced(f"answer to {uid} refused: the lease of token {self.token} was taken over")
        return result == 1

    async def pending(self, uids: Sequence[str]) -> list[bool]:
        """Whether each request is still in the backlog (its caller not answered yet)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for uid in uids:
                pipe.hexists(keys.BUS_BACKLOG, uid)
            return [bool(found) for found in await pipe.execute()]

    async def backlog(self, uids: Sequence[str]) -> list[bytes | None]:
        if not uids:
            return []
        values = await self.redis.hmget(keys.BUS_BACKLOG, list(uids))
        return cast(list[bytes | None], values)

    async def expired(self, now: float, count: int) -> list[str]:
        uids = await self.redis.zrangebyscore(keys.bus_expiry(), "-inf", now, start=0, num=count)
        return [u.decode() for u in cast(list[bytes], uids)]

    async def forget_seen(self, now: float) -> None:
        await self.redis.zremrangebyscore(keys.bus_seen(), "-inf", now)

    async def pending_requests(self, count: int) -> list[tuple[str, bytes, float]]:
        """Up to ``count`` backlog requests, soonest deadline first: (uid, body, deadline)."""
        ranked = await self.redis.zrange(keys.bus_expiry(), 0, count - 1, withscores=True)
        pairs = cast(list[tuple[bytes, float]], ranked)
        bodies = await self.backlog([uid.decode() for uid, _ in pairs])
        return [
            (uid.decode(), body, float(score))
            for (uid, score), body in zip(pairs, bodies, strict=True)
            if body is not None
        ]

    async def outbox_items(self, count: int) -> list[tuple[str, bytes]]:
        """Replies whose POST had not succeeded yet (requests are resent from the backlog)."""
        items: list[tuple[str, bytes]] = []
        async for field, value in self.redis.hscan_iter(keys.bus_outbox(), count=500):
            items.append((field.decode(), value))
            if len(items) >= count:
                break
        return items

    async def drop_outbox(self, *outbox_ids: str) -> None:
        """Forget sent replies (one HDEL for all of them)."""
        await self.coalescer.call(lambda pipe: pipe.hdel(keys.bus_outbox(), *outbox_ids))
