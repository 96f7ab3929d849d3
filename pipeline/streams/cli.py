"""``sluice node``: an always-on node with the stream service, the stream transport and workers.

Settings (``SLUICE_*``): ``node_name``, ``node_workers`` (``echo``,
``requester``), ``node_listen`` (TCP transport, if set), ``redis_url``,
``consumer_max_failures``, ``lease_ttl_s``, ``max_payload``. Flags override
them. SIGTERM / SIGINT stop it gracefully: consumers stop pulling, in-flight
handlers finish, indexes are saved, leases released.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from pathlib import Path
from typing import Any

from pipeline.cliargs import plain
from pipeline.errors import ConfigError
from pipeline.redisio import check as redischeck
from pipeline.redisio.durability import Durability
from pipeline.routing.message import parse_route
from pipeline.routing.node import Node, Transport, Worker
from pipeline.routing.workers import Echo, Requester
from pipeline.runtime import health
from pipeline.settings import Settings
from pipeline.streams.service import StreamService
from pipeline.streams.serviceredis import connect, connect_hot
from pipeline.streams.transport import StreamTransport

log = logging.getLogger(__name__)

#: Room for routes and framing on top of ``max_payload`` in a stream entry.
ENTRY_OVERHEAD = 1 << 16


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sluice node", description=plain(__doc__.splitlines()[0]))
    ap.add_argument("--name", help="node name (SLUICE_NODE_NAME)")
    ap.add_argument(
        "--workers", help="comma-separated workers: echo, requester (SLUICE_NODE_WORKERS)"
    )
    ap.add_argument("--consume", default="", help="comma-separated streams to subscribe to")
    ap.add_argument("--listen", help="TCP listen address host:port (SLUICE_NODE_LISTEN)")
    ap.add_argument("--request-route", default="", help="requester route, e.g. stream:b/a,echo")
    ap.add_argument(
        "--request-count",
        type=int,
        default=0,
        help="requester: how many requests to send, one per --request-interval (default: 0)",
    )
    ap.add_argument("--request-interval", type=float, default=0.0, help="seconds between requests")
    ap.add_argument("--record", default="", help="requester: append reply payloads to this file")
    return ap


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.name:
        overrides["node_name"] = args.name
    if args.workers is not None:
        overrides["node_workers"] = args.workers
    if args.listen is not None:
        overrides["node_listen"] = args.listen
    return Settings.load(parts=("redis", "node"), **overrides)


def _tcp_transport(settings: Settings) -> Transport:
    """The Dialogue TCP transport (address type 1): always registered so any node can
    send to ``tcp:host:port`` hops; it listens only when ``node_listen`` is set."""
    from pipeline.dialogue.transport import TcpTransport

    made: Transport = TcpTransport.from_settings(settings)
    return made


def _worker(name: str, args: argparse.Namespace) -> Worker:
    if name == "echo":
        return Echo()
    if name == "requester":
        if not args.request_route:
            raise ConfigError("the requester worker needs --request-route")
        return Requester(
            parse_route(args.request_route),
            args.request_count,
            record=Path(args.record) if args.record else None,
            interval_s=args.request_interval,
        )
    raise ConfigError(f"unknown worker {name!r} (known: echo, requester)")


async def serve(settings: Settings, args: argparse.Namespace, stop: asyncio.Event) -> Node:
    """Run a node until ``stop`` is set; returns the stopped node (for its counters)."""
    workers = {name: _worker(name, args) for name in settings.node.workers}
    consume = [s.strip() for s in args.consume.split(",") if s.strip()]
    redis = connect(settings.redis.url)
    node = Node(settings.node.name, max_payload=settings.max_payload)
    node.register_transport(
        StreamTransport(
            max_failures=settings.node.consumer_max_failures,
            lease_ttl_ms=int(settings.node.lease_ttl_s * 1000),
            send_timeout_s=settings.node.send_timeout_s,
        )
    )
    node.register_transport(_tcp_transport(settings))
    try:
        await node.add_worker(
            "stream_service",
            StreamService(
                redis,
                max_payload=settings.max_payload + ENTRY_OVERHEAD,
                hot=connect_hot(settings.redis.url),
                durability=Durability(
                    settings.redis.min_replicas, settings.redis.min_replicas_timeout_ms
                ),
            ),
        )
        await node.start()
        stream_transport = node.transport(2)
        assert isinstance(stream_transport, StreamTransport)
        for stream in consume:
            await stream_transport.subscribe(stream)
        for name, worker in workers.items():
            await node.add_worker(name, worker)
        async with health.serving(
            settings.node.health_listen,
            "sluice_node",
            checks={"redis": health.redis_writable(redis, f"node:{settings.node.name}")},
            samples=lambda: health.counter_samples("sluice_node", node.statistics()),
        ):
            print(f"node {settings.node.name} ready", flush=True)
            await stop.wait()
        log.info("node %s: stopping", settings.node.name)
    finally:
        await node.stop()
        await redis.aclose()
    return node


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    settings = _settings(args)
    redischeck.check(settings.redis.url, command="node")

    async def run() -> Node:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await serve(settings, args, stop)

    node = asyncio.run(run())
    print(json.dumps({"node": node.name, "counters": dict(node.counters)}), flush=True)
    return 0
