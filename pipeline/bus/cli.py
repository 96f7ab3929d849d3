"""``sluice bus``: run one twin's bus process; ``sluice bus keygen``; ``sluice bus register``.

::

    sluice bus keygen --out twin1001.key            # prints the public key
    sluice bus --twin 1001 --listen 127.0.0.1:8051 --directory twins.json --key twin1001.key
    sluice bus register --twin 1002 --url http://127.0.0.1:8052 --key <public key>

Settings (``SLUICE_REDIS_URL``, ``SLUICE_BUS_*``) give the defaults; flags win.
SIGTERM / SIGINT stop it gracefully: queued and pending work stays in Redis
and is picked up by the next start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from pipeline import health
from pipeline.bus.config import BusConfig
from pipeline.bus.directory import Directory, FileDirectory, RedisDirectory
from pipeline.bus.process import BusProcess
from pipeline.bus.signing import Signer
from pipeline.errors import ConfigError
from pipeline.settings import Settings


def _keygen(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sluice bus keygen", description="new Ed25519 key")
    parser.add_argument("--out", required=True, help="private key file to create (mode 0600)")
    args = parser.parse_args(argv)
    signer = Signer.generate()
    try:
        signer.write(args.out)
    except FileExistsError:
        print(f"sluice bus keygen: {args.out} exists, not overwriting", file=sys.stderr)
        return 1
    print(signer.public_key)
    return 0


def _register(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice bus register", description="add a twin to the Redis directory"
    )
    parser.add_argument("--twin", type=int, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", default="", help="base64 public key (empty: legacy peer)")
    parser.add_argument("--redis", default=None)
    args = parser.parse_args(argv)
    url = args.redis or Settings.load().redis_url

    async def run() -> None:
        client = aioredis.Redis.from_url(url)
        try:
            await RedisDirectory.register(client, args.twin, args.url, args.key)
        finally:
            await client.aclose()

    asyncio.run(run())
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice bus",
        description="the reliable message bus of one twin (also: 'keygen', 'register')",
    )
    parser.add_argument("--twin", type=int, default=None, help="this twin's id")
    parser.add_argument("--listen", default=None, help="host:port for /zbus-remote, /zbus-reply")
    parser.add_argument("--directory", default=None, help="twin directory file (JSON or TOML)")
    parser.add_argument("--key", default=None, help="private key file from 'sluice bus keygen'")
    parser.add_argument("--redis", default=None, help="this twin's Redis URL")
    parser.add_argument("--legacy-peers", action="store_true", default=None)
    return parser


async def _serve(settings: Settings, signer: Signer | None) -> int:
    config = BusConfig.from_settings(settings)
    client: aioredis.Redis | None = None
    directory: Directory
    if settings.bus_directory:
        directory = FileDirectory.load(settings.bus_directory)
    else:
        client = aioredis.Redis.from_url(settings.redis_url)
        directory = RedisDirectory(client)
    bus = BusProcess(config, redis_url=settings.redis_url, directory=directory, signer=signer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        await bus.start()
        print(f"sluice bus: twin {config.twin} listening on {config.host}:{bus.port}", flush=True)
        async with health.serving(
            settings.bus_health_listen,
            "sluice_bus",
            checks={"redis": bus.redis.ping},
            samples=lambda: health.bus_samples(bus.redis),
        ):
            stopping = asyncio.create_task(stop.wait())
            failing = asyncio.create_task(bus.wait())
            done, _ = await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
            for task in (stopping, failing):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if failing in done and not failing.cancelled() and failing.exception() is not None:
            print(f"sluice bus: failed: {failing.exception()!r}", file=sys.stderr)
            code = 1
    finally:
        await bus.stop()
        if client is not None:
            await client.aclose()
    return code


def main(argv: list[str]) -> int:
    if argv[:1] == ["keygen"]:
        return _keygen(argv[1:])
    if argv[:1] == ["register"]:
        return _register(argv[1:])
    args = _parser().parse_args(argv)
    overrides: dict[str, Any] = {}
    for flag, name in (
        ("twin", "bus_twin"),
        ("listen", "bus_listen"),
        ("directory", "bus_directory"),
        ("key", "bus_key_file"),
        ("redis", "redis_url"),
        ("legacy_peers", "bus_legacy_peers"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides[name] = value
    settings = Settings.load(**overrides)
    if settings.bus_twin <= 0:
        raise ConfigError("the bus needs a twin id: --twin ID or SLUICE_BUS_TWIN")
    signer: Signer | None = None
    if settings.bus_key_file:
        signer = Signer.from_file(settings.bus_key_file)
    elif not settings.bus_legacy_peers:
        raise ConfigError(
            "the bus needs a private key: --key FILE (see 'sluice bus keygen'), "
            "or SLUICE_BUS_LEGACY_PEERS=1 to run unsigned"
        )
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_serve(settings, signer))


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (it is faster), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
