"""``sluice subscribe``: print ordered chain updates (one JSON line each) from a server."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from pipeline.blockcodec import parse_hash
from pipeline.chain.cardinal import CARDINAL, DIALECTS, SEED
from pipeline.chain.client.consumer import subscribe
from pipeline.chain.client.ordered import Added
from pipeline.cliargs import non_negative, plain
from pipeline.errors import BadBatch, ConfigError
from pipeline.settings import Settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluice subscribe", description=plain(__doc__))
    p.add_argument(
        "--url",
        help="ws://host:port/ws, or .../cardinal for --dialect cardinal "
        "(default from SLUICE_SERVE_HOST/PORT)",
    )
    p.add_argument(
        "--dialect",
        choices=DIALECTS,
        default=SEED,
        help="wire dialect: seed (sluice serve's /ws) or cardinal (sluice serve's /cardinal, "
        "or a cardinal-streams websocket producer)",
    )
    p.add_argument(
        "--from", dest="from_num", type=non_negative(int), default=0, help="first block number"
    )
    p.add_argument("--hash", help="0x hash of block --from, when known")
    p.add_argument("--prefix", action="append", default=[], help="RE2 key prefix pattern (repeat)")
    p.add_argument("--count", type=int, default=0, help="stop after this many updates (0: never)")
    p.add_argument("--token", help="bearer token (default SLUICE_SERVE_TOKEN)")
    p.add_argument(
        "--retries",
        type=non_negative(int),
        default=20,
        help="reconnections without a block before giving up (default: %(default)s)",
    )
    return p


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    path = "/cardinal" if args.dialect == CARDINAL else "/ws"
    url = args.url or f"ws://{settings.serve.host}:{settings.serve.port}{path}"
    try:
        block_hash = parse_hash(args.hash) if args.hash else None
    except BadBatch as exc:
        raise ConfigError(f"--hash: {exc}") from exc
    seen = 0
    updates = subscribe(
        url,
        args.from_num,
        block_hash,
        args.prefix,
        token=args.token or settings.serve.token or None,
        dialect=args.dialect,
        max_retries=args.retries,
    )
    try:
        async for update in updates:
            if isinstance(update, Added):
                b = update.block
                line = {
                    "added": b.num,
                    "hash": "0x" + b.hash.hex(),
                    "parent": "0x" + b.parent.hex(),
                    "weight": None if b.weight is None else hex(b.weight),
                    "updates": {k: "0x" + v.hex() for k, v in b.updates.items()},
                    "deletes": list(b.deletes),
                    "subbatches": {
                        p: {k: "0x" + v.hex() for k, v in s.updates.items()}
                        for p, s in zip(b.batches, b.subbatches, strict=False)
                    },
                }
            else:
                line = {"removed": update.num, "hash": "0x" + update.hash.hex()}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
            seen += 1
            if args.count and seen >= args.count:
                break
    finally:
        await updates.aclose()  # type: ignore[attr-defined]
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(_run(args, Settings.load(parts=("serve",))))
