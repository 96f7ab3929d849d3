"""``sluice bus``: run one twin's bus process; ``keygen``, ``register``, ``dead``, ``requeue``.

::

    sluice bus keygen --out twin1001.key            # prints the public key
    sluice bus --twin 1001 --listen 127.0.0.1:8051 --directory twins.json --key twin1001.key
    sluice bus register --twin 1002 --url http://127.0.0.1:8052 --key <public key>
    sluice bus dead [--count 20]                    # messages the bus set aside, newest first
    sluice bus requeue --index 0 [--index 3 ...]    # push them back where they came from
    sluice bus requeue --all

Settings (``SLUICE_REDIS_URL``, ``SLUICE_BUS_*``) give the defaults; flags win.
SIGTERM / SIGINT stop it gracefully: queued and pending work stays in Redis
and is picked up by the next start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import signal
import sys
import time
from typing import Any, cast

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import dead
from pipeline.bus.config import BusConfig, bus_redis_url
from pipeline.bus.directory import Directory, FileDirectory, RedisDirectory
from pipeline.bus.process import BusProcess
from pipeline.bus.signing import Signer
from pipeline.errors import ConfigError
from pipeline.redisio import check as redischeck
from pipeline.redisio import conn as redisconn
from pipeline.redisio.durability import Durability
from pipeline.runtime import health, loops
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
    except OSError as exc:  # a missing directory, no permission
        print(f"sluice bus keygen: cannot create {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    print(signer.public_key)
    return 0


def _register(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice bus register", description="add a twin to the Redis directory"
    )
    parser.add_argument("--twin", type=int, required=True, help="the twin's id")
    parser.add_argument(
        "--url", required=True, help="where the twin's bus listens, e.g. http://10.0.0.2:8420"
    )
    parser.add_argument("--key", default="", help="base64 public key (empty: legacy peer)")
    parser.add_argument("--redis", default=None, help="the Redis URL (SLUICE_REDIS_URL)")
    args = parser.parse_args(argv)
    url = _url(args.redis)

    async def run() -> None:
        client = redisconn.connect(url, redisconn.Role.CLI)
        try:
            await RedisDirectory.register(client, args.twin, args.url, args.key)
        finally:
            await client.aclose()

    try:
        asyncio.run(run())
    except redisconn.UNAVAILABLE as exc:
        return _redis_down("register", exc)
    return 0


def _url(given: str | None) -> str:
    """The twin's Redis URL of a subcommand; a URL the bus refuses (a cluster's) is the
    same one line as for the bus itself (:class:`ConfigError`), before any connection."""
    return bus_redis_url(given or Settings.load(parts=("redis",)).redis.url)


def _redis_down(command: str, exc: BaseException) -> int:
    print(f"sluice bus {command}: redis unavailable: {exc}", file=sys.stderr)
    return 1


def _dead(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice bus dead", description="list the bus's dead letters, newest first"
    )
    parser.add_argument(
        "--count", type=int, default=20, help="show at most this many (default: %(default)s)"
    )
    parser.add_argument("--redis", default=None, help="the Redis URL (SLUICE_REDIS_URL)")
    args = parser.parse_args(argv)
    client = redisconn.connect_sync(_url(args.redis), redisconn.Role.CLI)
    try:
        entries = cast(list[bytes], client.lrange(keys.bus_dead(), 0, max(args.count, 1) - 1))
    except redisconn.UNAVAILABLE as exc:
        return _redis_down("dead", exc)
    finally:
        client.close()
    if not entries:
        print("no dead letters: the bus set nothing aside")
        return 0
    for index, raw in enumerate(entries):
        try:
            letter = dead.parse(raw)
        except ValueError:
            print(f"{index}\t(unreadable entry)")
            continue
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(letter.at))
        cut = " truncated" if letter.truncated else ""
        print(
            f"{index}\t{when}\t{letter.queue}\tattempts={letter.attempts}"
            f"\tsize={letter.size}{cut}\t{letter.reason}"
        )
        print(f"\t{json.dumps(letter.body[:200].decode('utf-8', 'replace'))}")
    return 0


def _requeue(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice bus requeue",
        description="push dead letters back onto the queue they came from",
    )
    parser.add_argument(
        "--index",
        type=int,
        action="append",
        default=[],
        help="the dead letter at this index of 'sluice bus dead' (repeatable)",
    )
    parser.add_argument("--all", action="store_true", help="every dead letter")
    parser.add_argument("--redis", default=None, help="the Redis URL (SLUICE_REDIS_URL)")
    args = parser.parse_args(argv)
    if not args.index and not args.all:
        parser.error("name entries with --index (see 'sluice bus dead') or use --all")
    client = redisconn.connect_sync(_url(args.redis), redisconn.Role.CLI)
    moved = 0
    try:
        entries = cast(list[bytes], client.lrange(keys.bus_dead(), 0, -1))
        chosen = range(len(entries)) if args.all else args.index
        unknown = [i for i in chosen if not 0 <= i < len(entries)]
        if unknown:
            print(
                f"sluice bus requeue: no dead letter at index {', '.join(map(str, unknown))} "
                f"({len(entries)} held; see 'sluice bus dead')",
                file=sys.stderr,
            )
            return 2
        for index in chosen:
            raw = entries[index]
            letter = dead.parse(raw)
            if letter.truncated or letter.queue in ("", keys.BUS_BACKLOG):
                print(f"{index}: not requeued (truncated or not from a queue)", file=sys.stderr)
                continue
            with client.pipeline(transaction=True) as pipe:
                pipe.lrem(keys.bus_dead(), 1, raw)  # type: ignore[arg-type]
                pipe.rpush(letter.queue, letter.body)
                pipe.execute()
            moved += 1
    except redisconn.UNAVAILABLE as exc:
        return _redis_down("requeue", exc)
    finally:
        client.close()
    print(f"requeued {moved}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice bus",
        description="Run the reliable message bus of one twin.",
        epilog=SUBCOMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--twin", type=int, default=None, help="this twin's id (SLUICE_BUS_TWIN)")
    parser.add_argument(
        "--listen",
        default=None,
        help="host:port for /zbus-remote and /zbus-reply (SLUICE_BUS_LISTEN)",
    )
    parser.add_argument(
        "--directory",
        default=None,
        help="twin directory file, JSON or TOML; none: the Redis hash (SLUICE_BUS_DIRECTORY)",
    )
    parser.add_argument(
        "--key",
        default=None,
        help="private key file from 'sluice bus keygen' (SLUICE_BUS_KEY_FILE)",
    )
    parser.add_argument("--redis", default=None, help="this twin's Redis URL (SLUICE_REDIS_URL)")
    parser.add_argument(
        "--legacy-peers",
        action="store_true",
        default=None,
        help="accept unsigned requests from peers that cannot sign (SLUICE_BUS_LEGACY_PEERS)",
    )
    return parser


#: The epilog of ``sluice bus --help``: the subcommands beside the bus itself.
SUBCOMMANDS = """subcommands (each with its own --help):
  sluice bus keygen --out FILE           create a private key, print its public key
  sluice bus register --twin ID --url URL --key PUB
                                         put a twin in the Redis twin directory
  sluice bus dead [--count N]            the messages the bus set aside, and why
  sluice bus requeue --index I | --all   put set-aside messages back on their queue"""


async def _serve(settings: Settings, signer: Signer | None) -> int:
    config = BusConfig.from_settings(settings)
    directory, client = _directory(settings)
    durability = Durability(settings.redis.min_replicas, settings.redis.min_replicas_timeout_ms)
    bus = BusProcess(
        config,
        redis_url=settings.redis.url,
        directory=directory,
        signer=signer,
        durability=durability,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if not await _until_redis(bus.redis, stop):
            return 0  # stopped while waiting: nothing was started
        # Redis was down at start: its layout was not checked yet (one line, exit 2)
        await asyncio.to_thread(redischeck.check, settings.redis.url)
        await bus.start()
        print(f"sluice bus: twin {config.twin} listening on {config.host}:{bus.port}", flush=True)
        async with health.serving(
            settings.bus.health_listen,
            "sluice_bus",
            checks={
                "redis": health.redis_writable(bus.redis, f"bus:{config.twin}"),
                "peers": functools.partial(_peers_answer, bus),
            },
            samples=functools.partial(_samples, bus),
            info=lambda: {"role": bus.role, "active": bus.seat.active if bus.seat else ""},
        ):
            failure = await _until_stopped_or_failed(bus, stop)
        if failure is not None:
            print(f"sluice bus: failed: {failure!r}", file=sys.stderr)
            return 1
        return 0
    finally:
        await bus.stop()
        if client is not None:
            await client.aclose()


def _directory(settings: Settings) -> tuple[Directory, aioredis.Redis | None]:
    """The twin directory: the file when one is set, else the Redis hash (with its
    client, for the caller to close)."""
    if settings.bus.directory:
        return FileDirectory.load(settings.bus.directory), None
    client = redisconn.connect(settings.redis.url, redisconn.Role.CLI)
    return RedisDirectory(client), client


async def _samples(bus: BusProcess) -> list[health.Sample]:
    """The bus's /metrics samples beyond the health server's own."""
    forwarder = bus.forwarder
    return [
        *await health.bus_samples(bus.redis),
        *health.forwarder_samples(forwarder.outcomes, forwarder.retried, forwarder.unreachable()),
        health.Sample(
            name="sluice_bus_not_replicated_total",
            value=float(bus.queues.not_replicated),
            kind="counter",
            help="requests sent before SLUICE_REDIS_MIN_REPLICAS replicas held them",
        ),
        health.Sample(
            name="sluice_bus_http_slow_bodies_total",
            value=float(bus.ingress.counts["slow_bodies"]),
            kind="counter",
            help="POST bodies that did not arrive within SLUICE_BUS_HTTP_IDLE_S (408, closed)",
        ),
        health.Sample(
            name="sluice_bus_active",
            value=1.0 if bus.role == "active" else 0.0,
            help="1 while this bus holds its twin's lease (0: standby)",
        ),
        health.Sample(
            name="sluice_bus_redis_errors_total",
            value=bus.redis_errors + bus.ingress.counts["redis_errors"],
            kind="counter",
            help="Redis steps of the bus's loops and endpoints that failed (away or refusing writes)",
        ),
        *(
            health.Sample(
                name="sluice_bus_answers_total",
                value=float(count),
                kind="counter",
                labels={"outcome": outcome},
                help="answers to this twin's callers, by what happened",
            )
            for outcome, count in sorted(answer_counts(bus).items())
        ),
    ]


#: What a caller's answer can say happened, as ``sluice_bus_answers_total``'s labels.
ANSWER_OUTCOMES = ("answered", "handler_failed", "unreachable", "unknown", "refused", "expired")


def answer_counts(bus: BusProcess) -> dict[str, int]:
    """The answers this twin's callers got, by what happened: a reply (``answered``,
    ``handler_failed`` when it carries the handler's ``err``), a request that never
    reached its peer (``unreachable``), may have (``unknown``), that the peer or the
    directory refused (``refused``, also an invalid request), or whose ``exp`` passed
    (``expired``: when it was taken, before it was sent, or by the scrubber)."""
    here = bus.ingress.counts + bus.queues.answers
    sent = bus.forwarder.outcomes
    counts = {o: here[o] + sent.get(("remote", o), 0) for o in ANSWER_OUTCOMES}
    counts["expired"] += bus.expired
    return counts


async def _peers_answer(bus: BusProcess) -> None:
    """The /healthz check ``peers``: fails while a peer answers no POST."""
    down = bus.forwarder.unreachable()
    if down:
        raise ConnectionError(
            ", ".join(f"twin {t} unreachable for {s:.0f}s" for t, s in sorted(down.items()))
        )


async def _until_stopped_or_failed(bus: BusProcess, stop: asyncio.Event) -> BaseException | None:
    """Wait for a stop signal or for the bus to fail; the bus's failure, if that came first."""
    stopping = asyncio.create_task(stop.wait())
    failing = asyncio.create_task(bus.wait())
    done, _ = await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stopping, failing):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if failing in done and not failing.cancelled():
        return failing.exception()
    return None


async def _until_redis(client: aioredis.Redis, stop: asyncio.Event) -> bool:
    """Wait until Redis answers (one line when it does not); False if stopped meanwhile."""
    delay = 0.2
    waiting = False
    while not stop.is_set():
        try:
            await client.ping()
        except redisconn.UNAVAILABLE as exc:
            redisconn.checkpoint(exc)
            if not waiting:
                print(f"sluice bus: waiting for redis: {exc}", file=sys.stderr, flush=True)
                waiting = True
        else:
            if waiting:
                print("sluice bus: redis is up", file=sys.stderr, flush=True)
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, 5.0)
    return False


def main(argv: list[str]) -> int:
    if argv[:1] == ["keygen"]:
        return _keygen(argv[1:])
    if argv[:1] == ["register"]:
        return _register(argv[1:])
    if argv[:1] == ["dead"]:
        return _dead(argv[1:])
    if argv[:1] == ["requeue"]:
        return _requeue(argv[1:])
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
    settings = Settings.load(parts=("redis", "bus"), **overrides)
    bus_redis_url(settings.redis.url)  # a cluster URL: one line, before anything starts
    redischeck.check(settings.redis.url, command="bus")
    if settings.bus.twin <= 0:
        raise ConfigError("the bus needs a twin id: --twin ID or SLUICE_BUS_TWIN")
    signer: Signer | None = None
    if settings.bus.key_file:
        signer = Signer.from_file(settings.bus.key_file)
    elif not settings.bus.legacy_peers:
        raise ConfigError(
            "the bus needs a private key: --key FILE (see 'sluice bus keygen'), "
            "or SLUICE_BUS_LEGACY_PEERS=1 to run unsigned"
        )
    return loops.run(_serve(settings, signer))
