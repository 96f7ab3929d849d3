"""``sluice serve``: the websocket resumption server.

Relay mode (default) tails the Redis chain stream for live data, so any number
of servers can run side by side. ``--in-process`` instead runs a synthetic
chain producer inside the server, sending each block to Redis and to the
live hub through a :class:`~pipeline.chain.produce.producer.MuxProducer`.

The stream must be a chain stream: one ``SLUICE_CHAIN_STREAMS`` names (its
history comes from the lake, which keeps the blocks of those only), whose
first and last entries in Redis do not both lack a ``block`` field. Anything
else is refused at start in one line (:func:`check_stream`); with Redis away
at start the entries are not looked at (that is no reason to stay down).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
from typing import Any

from aiohttp import web

from pipeline import keys
from pipeline.blockcodec.streamkind import Look, look, mismatch, not_chain
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.produce.producer import MuxProducer, RedisStreamProducer, WebsocketHub
from pipeline.cliargs import non_negative, plain
from pipeline.errors import MuxError, StreamKindError
from pipeline.redisio import check as redischeck
from pipeline.redisio.conn import UNAVAILABLE, Role, connect, connect_sync
from pipeline.runtime import loops
from pipeline.settings import Settings

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sluice serve",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", help="listen address (SLUICE_SERVE_HOST)")
    p.add_argument("--port", type=int, help="listen port (SLUICE_SERVE_PORT)")
    p.add_argument("--stream", help="chain stream name (SLUICE_SERVE_STREAM)")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="produce a synthetic chain in this process (Redis + live hub) instead of tailing Redis",
    )
    p.add_argument(
        "--rate", type=non_negative(float), default=10.0, help="blocks/s for --in-process"
    )
    p.add_argument(
        "--dialogue-port",
        type=int,
        help="also serve the feed over Dialogue duplexes on this TCP port (SLUICE_SERVE_DIALOGUE_PORT)",
    )
    return p


async def _produce(settings: Settings, hub: WebsocketHub, rate: float, stop: asyncio.Event) -> None:
    client = connect(settings.redis.url, Role.PRODUCER)
    mux = MuxProducer(
        [("redis", RedisStreamProducer(client, settings.serve.stream)), ("websocket", hub)]
    )
    chain = SyntheticChain(seed=0, reorg_every=50, reorg_depth=3)
    try:
        while not stop.is_set():
            for block in chain.step():
                try:
                    await mux.send(block)
                except MuxError as exc:
                    log.warning("%s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate)
    finally:
        await client.aclose()


#: Why a stream ``SLUICE_CHAIN_STREAMS`` does not name cannot be served.
NOT_CHAIN = (
    "serve reads its history from the lake, which keeps the blocks of chain streams only: "
    "add it to SLUICE_CHAIN_STREAMS"
)


def check_stream(settings: Settings) -> None:
    """:class:`StreamKindError` unless ``settings.serve.stream`` is a declared chain stream
    whose first and last entries in Redis are not all plain (no Redis: not looked at)."""
    stream, chain_streams = settings.serve.stream, settings.lake.chain_streams
    refusal = not_chain(chain_streams, stream, NOT_CHAIN)
    if refusal is None:
        refusal = mismatch(chain_streams, stream, _ends(settings))
    if refusal is not None:
        raise StreamKindError(refusal)


def _ends(settings: Settings) -> list[Look]:
    """How the first and last entries of the served stream look (none: empty, or no Redis)."""
    key = keys.stream(settings.serve.stream)
    client = connect_sync(settings.redis.url, Role.CLI)
    try:
        if client.type(key) != b"stream":
            return []
        first = client.xrange(key, "-", "+", count=1) or []
        last = client.xrevrange(key, "+", "-", count=1) or []
    except UNAVAILABLE as exc:
        log.info("%s: its entries not looked at (redis unavailable: %s)", key, exc)
        return []
    finally:
        client.close()
    ends: dict[Any, Any] = {entry_id: fields for entry_id, fields in [*first, *last]}
    return [look(fields or {}) for fields in ends.values()]


#: The cyclic GC's thresholds once start-up is frozen (CPython's default: 700, 10, 10).
#: Live fan-out allocates a few containers per block and subscriber that reference
#: counting frees; at the default a young collection ran every few blocks and a full
#: one, walking every connection's objects (tens of milliseconds, no block sent
#: meanwhile), every few seconds: together about a tenth of the server's CPU
#: (``make bench B=resume``). Cycles are still collected, each generation about
#: fourteen times less often (a full collection after about a million allocations).
GC_THRESHOLDS = (10_000, 10, 10)


def freeze_startup_heap() -> None:
    """Leave what start-up built (modules, the app: over 100,000 objects) out of the cyclic GC.

    A full collection walks every tracked object; with start-up's among them one took
    90-550 ms on this 2-core machine, during which no block goes out to anyone
    (``fanout_p99_ms`` of ``make bench B=resume``). Frozen objects are still freed by
    reference counting; only cycles among them stay, and start-up's live as long as
    the process. Later objects (connections, blocks) are collected as before, at
    :data:`GC_THRESHOLDS`.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(settings: Settings, *, in_process: bool = False, rate: float = 10.0) -> None:
    # here, not at the top: they load pyarrow and deltalake, which `sluice serve --help`
    # must not need (a core install answers it; the dispatcher names the [serve] extra)
    from pipeline.chain.serve.appkeys import GUARD
    from pipeline.chain.serve.server import create_app

    hub = WebsocketHub()
    app = create_app(settings, relay=not in_process, hub=hub)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    # aiohttp's TCPSite, behind the connection cap and the request-head deadline
    listener = await app[GUARD].listen(runner, settings.serve.host, settings.serve.port)
    freeze_startup_heap()
    base = f"ws://{settings.serve.host}:{settings.serve.port}"
    log.info(
        "serving %s on %s/ws (the seed's JSON-RPC dialect) and %s/cardinal "
        "(the cardinal-streams library's dialect: its Go consumer's URL)",
        settings.serve.stream,
        base,
        base,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    producer = asyncio.create_task(_produce(settings, hub, rate, stop)) if in_process else None
    try:
        await stop.wait()
    finally:
        if producer is not None:
            stop.set()
            await producer
        listener.close()
        await runner.cleanup()  # closes the connections still open
        await listener.wait_closed()


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    overrides = {
        k: v
        for k, v in {
            "serve_host": args.host,
            "serve_port": args.port,
            "serve_stream": args.stream,
            "serve_dialogue_port": args.dialogue_port,
        }.items()
        if v is not None
    }
    settings = Settings.load(parts=("redis", "serve", "lake"), **overrides)
    redischeck.check(settings.redis.url, command="serve")
    check_stream(settings)
    loops.run(serve(settings, in_process=args.in_process, rate=args.rate))
    return 0
