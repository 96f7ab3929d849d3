"""``sluice produce``: write a synthetic chain into the Redis chain stream at a rate."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import redis.asyncio as aioredis

from pipeline.chain.generator import SyntheticChain
from pipeline.chain.producer import RedisStreamProducer
from pipeline.settings import Settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluice produce", description=__doc__)
    p.add_argument("--stream", help="chain stream name (default SLUICE_SERVE_STREAM)")
    p.add_argument(
        "--rate", type=float, default=10.0, help="blocks per second (0: as fast as possible)"
    )
    p.add_argument(
        "--count", type=int, default=100, help="blocks to produce (0: until interrupted)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keys", type=int, default=64, help="key space size")
    p.add_argument("--prefix", action="append", help="sub-batch prefix (repeat; default s/)")
    p.add_argument("--reorg-every", type=int, default=0, help="a reorg every N steps (0: never)")
    p.add_argument("--reorg-depth", type=int, default=2, help="maximum reorg depth")
    return p


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    chain = SyntheticChain(
        seed=args.seed,
        keys=args.keys,
        prefixes=tuple(args.prefix or ("s/",)),
        reorg_every=args.reorg_every,
        reorg_depth=args.reorg_depth,
    )
    client = aioredis.Redis.from_url(settings.redis_url)
    producer = RedisStreamProducer(client, args.stream or settings.serve_stream)
    sent = 0
    start = time.monotonic()
    try:
        while not args.count or sent < args.count:
            for block in chain.step():
                await producer.send(block)
                sent += 1
            if args.rate > 0:
                delay = start + sent / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
    finally:
        await producer.close()
    head = chain.head.num if chain.head else None
    sys.stdout.write(f"produced {sent} blocks ({chain.reorgs} reorgs), head {head}\n")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(_run(args, Settings.load()))
