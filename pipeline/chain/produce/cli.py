"""``sluice produce``: write a synthetic chain into the Redis chain stream at a rate.

It rides out a Redis restart or a Redis refusing writes (``maxmemory`` reached
with ``noeviction``, a replica, a failed RDB save): a block that cannot be written is retried with
backoff (one log line when the outage starts, one when it ends) for up to
``--retry-for`` seconds, then the command fails with a one-line error. The
append is idempotent, so a retry after a write whose answer was lost never
duplicates a block, and the chain only moves on once a block is in: nothing
is lost either. One producer per stream (the check compares with the last
entry).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from redis.exceptions import NoScriptError, RedisError, ResponseError

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, decode_block, encode_block
from pipeline.chain.produce.generator import SyntheticChain, linked_chain
from pipeline.cliargs import non_negative, plain
from pipeline.errors import BadBatch, NotReplicated, ProducerGaveUp
from pipeline.loggate import LogGate
from pipeline.redisio import check as redischeck
from pipeline.redisio.conn import UNAVAILABLE, Role, checkpoint, connect, pipe_evalsha, unavailable
from pipeline.redisio.durability import Durability
from pipeline.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

#: XADD unless the stream's last entry is this very block (a retried write that had landed).
_APPEND = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if last then
  local f = last[2]
  for i = 1, #f, 2 do
    if f[i] == ARGV[1] and f[i + 1] == ARGV[2] then return last[1] end
  end
end
return redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
"""

#: Entries first read back to go on from a stream's head; more while the chain they link is
#: shorter than ``--reorg-depth`` + 1 blocks (replaced branches sit among them), up to
#: :data:`RESUME_ENTRIES_MAX`. Reorgs reach no deeper than the linked blocks.
RESUME_ENTRIES = 256
RESUME_ENTRIES_MAX = 16_384
#: Retried until ``--retry-for`` runs out: Redis away, moving or refusing writes (see
#: :func:`~pipeline.redisio.conn.unavailable`), or a write too few replicas took.
_RETRIED: tuple[type[BaseException], ...] = (*UNAVAILABLE, NotReplicated, RedisError)
BACKOFF_START_S = 0.1
BACKOFF_MAX_S = 2.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluice produce", description=plain(__doc__.splitlines()[0]))
    p.add_argument("--stream", help="chain stream name (default SLUICE_SERVE_STREAM)")
    p.add_argument(
        "--rate",
        type=non_negative(float),
        default=10.0,
        help="blocks per second (0: as fast as possible; default: %(default)s)",
    )
    p.add_argument(
        "--count",
        type=non_negative(int),
        default=100,
        help="blocks to produce (0: until interrupted; default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--keys", type=int, default=64, help="key space size (default: %(default)s)")
    p.add_argument("--prefix", action="append", help="sub-batch prefix (repeat; default s/)")
    p.add_argument(
        "--reorg-every",
        type=non_negative(int),
        default=0,
        help="a reorg every N steps (default 0: never)",
    )
    p.add_argument(
        "--reorg-depth",
        type=_at_least_one,
        default=2,
        help="maximum reorg depth: blocks replaced below the head (default: %(default)s)",
    )
    p.add_argument(
        "--from-genesis",
        action="store_true",
        help="start at block 0 even if the stream holds a chain (default: go on from its head)",
    )
    p.add_argument(
        "--retry-for",
        type=non_negative(float),
        default=600.0,
        help="seconds to keep retrying while Redis is unreachable or refuses writes before giving up "
        "(default: %(default)s)",
    )
    return p


def _at_least_one(text: str) -> int:
    value = non_negative(int)(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


class _Writer:
    """Appends blocks idempotently, retrying through outages (bounded by ``retry_for``)."""

    def __init__(
        self, url: str, stream: str, retry_for: float, durability: Durability | None = None
    ) -> None:
        self.client = connect(url, Role.PRODUCER)
        self.key = keys.stream(stream)
        self.retry_for = retry_for
        self.script = self.client.register_script(_APPEND)
        self.durability = durability or Durability()
        self.outages = 0
        self._gate = LogGate(log)

    async def _write(self, data: bytes) -> None:
        """One append; with a durability setting, ``WAIT`` on its connection after it
        (:class:`NotReplicated` when too few replicas took it: retried like an outage,
        the append being idempotent)."""
        if not self.durability.on:
            await self.script(keys=[self.key], args=[ENTRY_FIELD, data])
            return
        async with self.client.pipeline(transaction=False) as pipe:
            pipe_evalsha(pipe, self.script.sha, [self.key], [ENTRY_FIELD, data])
            self.durability.add_waits(pipe, self.client, [self.key])
            results = await pipe.execute(raise_on_error=False)
        if isinstance(results[0], NoScriptError):  # a restarted or promoted server
            await self.client.script_load(_APPEND)
            raise NotReplicated("script not loaded: loaded, retrying") from results[0]
        if isinstance(results[0], Exception):
            raise results[0]
        failure = self.durability.check(results[1:])
        if failure is not None:
            raise failure

    async def append(self, block: Block) -> bool:
        """Write one block; True if an outage was ridden out on the way."""
        data = encode_block(block)
        _, rode_out = await self._retrying(lambda: self._write(data), f"block {block.num}")
        return rode_out

    async def _retrying(self, op: Callable[[], Awaitable[T]], what: str) -> tuple[T, bool]:
        """``op()``'s result, retried through outages; and whether one was ridden out."""
        down_since: float | None = None
        delay = BACKOFF_START_S
        while True:
            try:
                result = await op()
            except _RETRIED as exc:
                checkpoint(exc)
                if isinstance(exc, RedisError) and not unavailable(exc):
                    raise  # e.g. WRONGTYPE: retrying cannot help
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    self.outages += 1
                elif now - down_since > self.retry_for:
                    raise ProducerGaveUp(
                        f"redis unavailable for {self.retry_for:.0f}s: {exc}"
                    ) from exc
                self._gate.failed(
                    "redis", "redis unavailable (%s: %s); retrying %s", type(exc).__name__, exc, what
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            self._gate.ended("redis", "redis is back")
            return result, down_since is not None

    async def recent(self, count: int) -> tuple[list[Block], bool]:
        """The stream's last ``count`` valid blocks, oldest first (entries that do not decode
        skipped); and whether that was the whole stream."""
        entries, _ = await self._retrying(
            lambda: self.client.xrevrange(self.key, count=count), "reading the stream's head"
        )
        blocks = []
        for _, fields in reversed(entries or []):
            try:
                blocks.append(decode_block(cast(bytes, (fields or {})[ENTRY_FIELD])))
            except (BadBatch, KeyError, TypeError):
                continue
        return blocks, len(entries or []) < count

    async def resume_from(self, reorg_depth: int) -> list[Block]:
        """The stream's last entries, enough to link ``reorg_depth`` + 1 blocks below its head
        (fewer if the stream or its links end first, or at :data:`RESUME_ENTRIES_MAX`)."""
        count, linked = RESUME_ENTRIES, -1
        while True:
            recent, whole = await self.recent(count)
            was, linked = linked, len(linked_chain(recent))
            if whole or linked > reorg_depth or linked == was or count >= RESUME_ENTRIES_MAX:
                return recent  # (linked == was: more entries brought no deeper ancestor)
            count = min(count * 4, RESUME_ENTRIES_MAX)

    async def trimmed_empty(self) -> str | None:
        """The stream's last entry id when it once held entries but holds none now (trimmed
        below its head: the chain is in the lake only), else None."""
        try:
            info, _ = await self._retrying(
                lambda: self.client.xinfo_stream(self.key), "reading the stream's state"
            )
        except ResponseError:
            return None  # no such stream: a new chain
        last = info.get("last-generated-id", b"0-0")
        last = last.decode() if isinstance(last, bytes) else str(last)
        return last if info.get("length", 0) == 0 and last != "0-0" else None

    async def close(self) -> None:
        await self.client.aclose()


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    chain = SyntheticChain(
        seed=args.seed,
        keys=args.keys,
        prefixes=tuple(args.prefix or ("s/",)),
        reorg_every=args.reorg_every,
        reorg_depth=args.reorg_depth,
    )
    stream = args.stream or settings.serve.stream
    writer = _Writer(
        settings.redis.url,
        stream,
        args.retry_for,
        Durability(settings.redis.min_replicas, settings.redis.min_replicas_timeout_ms),
    )
    sent = 0
    start = time.monotonic()
    try:
        if not args.from_genesis:
            resumed = chain.continue_from(await writer.resume_from(args.reorg_depth))
            if resumed is None and (last := await writer.trimmed_empty()) is not None:
                sys.stderr.write(
                    f"sluice produce: {stream} was trimmed empty (its last entry was {last}): its "
                    "chain goes on in the lake, which produce does not read; pass --from-genesis "
                    "to start a new chain at block 0\n"
                )
                return 2
            if resumed is not None:
                log.warning(
                    "%s holds a chain: going on from its head, block %d (0x%s)",
                    stream, resumed.num, resumed.hash.hex()[:16],
                )  # fmt: skip
                if args.reorg_every and chain.reorg_room < args.reorg_depth:
                    log.warning(
                        "reorgs reach at most %d below the head until the chain grows: "
                        "its last entries link blocks %d..%d only",
                        chain.reorg_room, chain.canonical[0].num, resumed.num,
                    )  # fmt: skip
        while not args.count or sent < args.count:
            for block in chain.step():
                if await writer.append(block) and args.rate > 0:
                    start = time.monotonic() - sent / args.rate  # no burst to catch up
                sent += 1
            if args.rate > 0:
                delay = start + sent / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
    except (ProducerGaveUp, RedisError) as exc:  # e.g. WRONGTYPE: retrying cannot help
        sys.stderr.write(f"sluice produce: {exc}; {sent} blocks produced\n")
        return 1
    finally:
        await writer.close()
    head = chain.head.num if chain.head else None
    outages = f", {writer.outages} redis outage(s) ridden out" if writer.outages else ""
    sys.stdout.write(f"produced {sent} blocks ({chain.reorgs} reorgs), head {head}{outages}\n")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    settings = Settings.load(parts=("redis", "serve"))
    redischeck.check(settings.redis.url, command="produce")
    return asyncio.run(_run(args, settings))
