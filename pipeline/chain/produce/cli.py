"""``sluice produce``: write a synthetic chain into the Redis chain stream at a rate.

It rides out a Redis restart or a Redis refusing writes (``maxmemory`` reached
with ``noeviction``, a replica, a failed RDB save, too few replicas for
``min-replicas-to-write``): a block that cannot be written is retried with
backoff (one log line when the outage starts, one when it ends) for up to
``--retry-for`` seconds, then the command fails with a one-line error. The
append is idempotent, so a retry after a write whose answer was lost never
duplicates a block, and the chain only moves on once a block is in: nothing
is lost either. One producer per stream (the check compares with the last
entry).

With ``--health-listen host:port`` it serves ``/healthz`` (503 with the cause while
it cannot write: Redis refusing the health key's write, or its blocks failing
to go in) and Prometheus ``/metrics`` (``sluice_produce_*``: blocks written,
reorgs, retries, failures by kind, outages begun and ridden out), as
``sluice node`` and ``sluice bus`` do on ``SLUICE_{NODE,BUS}_HEALTH_LISTEN``.
SIGTERM or SIGINT stops it after the block being written, with its summary.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from pipeline.chain.produce import probes
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.produce.writer import BlockWriter
from pipeline.cliargs import non_negative, plain
from pipeline.errors import ConfigError, ProducerGaveUp, SluiceError
from pipeline.redisio import check as redischeck
from pipeline.redisio.durability import Durability
from pipeline.runtime import health
from pipeline.settings import LakeSettings, Settings

log = logging.getLogger(__name__)


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
        help="start at block 0 even if the stream or the lake holds a chain (default: go on "
        "from the stream's head; refuse if only the lake holds it)",
    )
    p.add_argument(
        "--retry-for",
        type=non_negative(float),
        default=600.0,
        help="seconds to keep retrying while Redis is unreachable or refuses writes before giving up "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--health-listen",
        type=_listen,
        default="",
        metavar="HOST:PORT",
        help="serve /healthz (503 with the cause while blocks cannot be written) and Prometheus "
        "/metrics (sluice_produce_*: blocks written, reorgs, retries, outages ridden out) on "
        "HOST:PORT, as SLUICE_NODE_HEALTH_LISTEN does for sluice node (default: off)",
    )
    return p


def _listen(text: str) -> str:
    """``host:port`` checked now (a one-line usage error); empty: off."""
    try:
        if text:
            health.parse_listen(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _at_least_one(text: str) -> int:
    value = non_negative(int)(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    chain = SyntheticChain(
        seed=args.seed,
        keys=args.keys,
        prefixes=tuple(args.prefix or ("s/",)),
        reorg_every=args.reorg_every,
        reorg_depth=args.reorg_depth,
    )
    stream = args.stream or settings.serve.stream
    writer = BlockWriter(
        settings.redis.url,
        stream,
        args.retry_for,
        Durability(settings.redis.min_replicas, settings.redis.min_replicas_timeout_ms),
    )
    record = writer.record
    try:
        async with health.serving(
            args.health_listen,
            probes.PREFIX,
            checks={
                "redis": health.redis_writable(writer.client, f"produce:{stream}"),
                "writes": record.check,
            },
            samples=lambda: probes.samples(
                record, chain.reorgs, chain.head.num if chain.head else None
            ),
        ):
            code = await _until_signalled(
                lambda stopping: _produce(args, chain, writer, stream, stopping, settings.lake)
            )
    except (ProducerGaveUp, RedisError) as exc:  # e.g. WRONGTYPE: retrying cannot help
        sys.stderr.write(f"sluice produce: {exc}; {record.written} blocks produced\n")
        return 1
    finally:
        await writer.close()
    if code is not None and code != 0:
        return code
    head = chain.head.num if chain.head else None
    outages = f", {record.ridden_out} redis outage(s) ridden out" if record.ridden_out else ""
    stopped = "stopped: " if code is None else ""
    sys.stdout.write(
        f"{stopped}produced {record.written} blocks ({chain.reorgs} reorgs), head {head}{outages}\n"
    )
    return 0


async def _until_signalled(work: Callable[[asyncio.Event], Coroutine[Any, Any, int]]) -> int | None:
    """``work(stopping)``'s exit code; None when SIGTERM or SIGINT stopped it first.

    A signal cancels the work's task, which ends a wait for Redis at once (a block being
    written then may or may not be in: the append is idempotent, and the next run goes
    on from the stream's head), and sets ``stopping``, which ends the work before its
    next block should redis-py have swallowed the cancellation.
    """
    stopping = asyncio.Event()
    task = asyncio.ensure_future(work(stopping))

    def stop() -> None:
        stopping.set()
        task.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        code = await task
    except asyncio.CancelledError:
        if not stopping.is_set() or not task.cancelled():
            raise  # not ours: the caller was cancelled
        return None
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return None if stopping.is_set() and code == 0 else code


async def _resume(
    args: argparse.Namespace,
    chain: SyntheticChain,
    writer: BlockWriter,
    stream: str,
    lake: LakeSettings | None = None,
) -> int:
    """Go on from the stream's head unless ``--from-genesis``: 0, or 2 when the stream was
    trimmed empty or is gone while the lake holds its chain (which produce does not go on
    from: it reads the lake's head only, to refuse)."""
    if args.from_genesis:
        return 0
    resumed = chain.continue_from(await writer.resume_from(args.reorg_depth))
    if resumed is None and (last := await writer.trimmed_empty()) is not None:
        sys.stderr.write(
            f"sluice produce: {stream} was trimmed empty (its last entry was {last}): its "
            "chain goes on in the lake, which produce does not read; pass --from-genesis "
            "to start a new chain at block 0\n"
        )
        return 2
    if resumed is None and lake is not None:
        head = await asyncio.to_thread(_lake_head, lake, stream)
        if head is not None:
            # Redis lost the stream (a wipe, a restart without persistence): a new chain
            # from block 0 would be lighter than the lake's, and never canonical
            sys.stderr.write(
                f"sluice produce: {stream} is not in Redis, but the lake holds its chain up "
                f"to block {head} (did Redis lose its data?); produce does not go on from "
                "the lake: pass --from-genesis to start a new chain at block 0\n"
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
    return 0


async def _produce(
    args: argparse.Namespace,
    chain: SyntheticChain,
    writer: BlockWriter,
    stream: str,
    stopping: asyncio.Event,
    lake: LakeSettings | None = None,
) -> int:
    """Write ``--count`` blocks (0: until stopped) at ``--rate``; the exit code."""
    code = await _resume(args, chain, writer, stream, lake)
    if code:
        return code
    sent = 0
    start = time.monotonic()
    while (not args.count or sent < args.count) and not stopping.is_set():
        for block in chain.step():
            if await writer.append(block) and args.rate > 0:
                start = time.monotonic() - sent / args.rate  # no burst to catch up
            sent += 1
        if args.rate > 0:
            delay = start + sent / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
    return 0


def _lake_head(lake: LakeSettings, stream: str) -> int | None:
    """The lake's highest block of ``stream``, or None: none there, or the lake cannot be
    read here (no ``[serve]`` extra, or the store fails: then one warning, and produce
    starts a new chain as it would on a new stream)."""
    try:
        from pipeline.lake.storage.reader import LakeReader
        from pipeline.lake.storage.store import describe, store_errors
    except ImportError:
        return None
    failures: tuple[type[BaseException], ...] = (SluiceError, *store_errors())
    try:
        row = LakeReader(lake).head(stream)
    except failures as exc:
        log.warning("the lake could not be read to check for %s's chain: %s", stream, describe(exc))
        return None
    return None if row is None else row.num


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    settings = Settings.load(parts=("redis", "serve", "lake"))
    redischeck.check(settings.redis.url, command="produce")
    return asyncio.run(_run(args, settings))
