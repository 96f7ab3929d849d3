"""``/healthz`` and Prometheus ``/metrics`` for an always-on process (``sluice node``, ``sluice bus``).

A :class:`HealthServer` is a small aiohttp app on its own ``host:port``,
apart from the process's own traffic, so a probe never queues behind it:

- ``GET /healthz``: JSON ``{"status": "ok"|"degraded", "checks": {name: "ok"|error}, ...}``,
  200 when every check passed, 503 otherwise. A check is an async callable
  that returns normally when healthy and raises when not; each runs under
  :data:`CHECK_TIMEOUT_S`.
- ``GET /metrics``: Prometheus text (format 0.0.4) of the samples the process
  reports, plus ``<prefix>_up`` and ``<prefix>_uptime_seconds``.

Bounded: one evaluation of the checks (and one of the metrics) runs at a time
and its answer is shared with every request that arrives meanwhile and for
:data:`CACHE_S` after; nothing is kept per client. Only public aiohttp APIs.

Use :func:`serving` in a CLI: ``async with serving(listen, prefix, checks=...,
samples=...)`` is a no-op when ``listen`` is empty.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from pipeline import keys
from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Longest a health check (or a metrics read) may take before it counts as failed.
CHECK_TIMEOUT_S = 2.0
#: Answers are shared for this long: a probe storm costs one evaluation per window.
CACHE_S = 0.5

Check = Callable[[], Awaitable[object]]

#: The health key written by :func:`redis_writable` expires after this (milliseconds).
PROBE_TTL_MS = 60_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One Prometheus sample: ``name{labels} value``; ``kind`` is counter or gauge."""

    name: str
    value: float
    kind: str = "gauge"
    help: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


#: What a process reports on ``/metrics``: a plain or an async callable.
Samples = Callable[[], Iterable[Sample] | Awaitable[Iterable[Sample]]]

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(text: str) -> str:
    """A valid Prometheus metric name from any counter key (``stream_service.pushes`` ->
    ``stream_service_pushes``)."""
    name = _NAME_BAD.sub("_", text).strip("_") or "unnamed"
    return name if not name[0].isdigit() else "_" + name


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(samples: Iterable[Sample]) -> str:
    """Prometheus text exposition of ``samples`` (grouped by name, one HELP/TYPE each)."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(metric_name(sample.name), []).append(sample)
    lines: list[str] = []
    for name, group in groups.items():
        first = group[0]
        if first.help:
            lines.append(f"# HELP {name} {first.help}")
        lines.append(f"# TYPE {name} {first.kind}")
        for s in group:
            labels = ",".join(
                f'{metric_name(k)}="{_label_value(v)}"' for k, v in sorted(s.labels.items())
            )
            lines.append(
                f"{name}{{{labels}}} {_num(s.value)}" if labels else f"{name} {_num(s.value)}"
            )
    return "\n".join(lines) + "\n"


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``:port`` means 127.0.0.1) as a pair; :class:`ConfigError` otherwise."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"health listen address must be host:port, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port_text)


class _Shared:
    """One evaluation at a time, its result shared while it runs and for ``CACHE_S`` after."""

    def __init__(self, make: Callable[[], Awaitable[tuple[int, bytes]]]) -> None:
        self._make = make
        self._value: tuple[int, bytes] | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> tuple[int, bytes]:
        if self._value is not None and time.monotonic() - self._at < CACHE_S:
            return self._value
        async with self._lock:
            if self._value is None or time.monotonic() - self._at >= CACHE_S:
                self._value = await self._make()
                self._at = time.monotonic()
            return self._value


class HealthServer:
    """``/healthz`` and ``/metrics`` of one process on ``host:port`` (port 0: any free port)."""

    def __init__(
        self,
        host: str,
        port: int,
        prefix: str,
        *,
        checks: Mapping[str, Check] | None = None,
        samples: Samples | None = None,
        info: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.prefix = metric_name(prefix)
        self._checks = dict(checks or {})
        self._samples = samples
        self._info = info
        self._started = time.monotonic()
        self._runner: web.AppRunner | None = None
        self._health = _Shared(self._evaluate)
        self._metrics = _Shared(self._collect)
        #: Evaluations run (not requests served): what probes cost.
        self.evaluations = 0
        self.last_ok: bool | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics_handler)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(f"health endpoint: {exc.strerror or exc}") from exc
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # --- evaluation ------------------------------------------------------------

    async def _run_check(self, check: Check) -> str:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await check()
        except TimeoutError:
            return f"timed out after {CHECK_TIMEOUT_S}s"
        except Exception as exc:  # noqa: BLE001 - a failing check is the answer, not an endpoint error
            return f"{type(exc).__name__}: {exc}"[:200]
        return "ok"

    async def _evaluate(self) -> tuple[int, bytes]:
        self.evaluations += 1
        names = list(self._checks)
        results = await asyncio.gather(*(self._run_check(self._checks[n]) for n in names))
        checks = dict(zip(names, results, strict=True))
        ok = all(r == "ok" for r in results)
        self.last_ok = ok
        body: dict[str, Any] = {
            "status": "ok" if ok else "degraded",
            "checks": checks,
            "uptime_s": round(time.monotonic() - self._started, 1),
        }
        if self._info is not None:
            body.update(self._info())
        return (200 if ok else 503), json.dumps(body).encode()

    async def _collect(self) -> tuple[int, bytes]:
        base = [
            Sample(name=f"{self.prefix}_up", value=1, help="1 while the process serves metrics"),
            Sample(
                name=f"{self.prefix}_uptime_seconds",
                value=round(time.monotonic() - self._started, 3),
                help="seconds since the process started",
            ),
        ]
        if self.last_ok is not None:
            base.append(
                Sample(
                    name=f"{self.prefix}_healthy",
                    value=1 if self.last_ok else 0,
                    help="1 when the last /healthz evaluation passed",
                )
            )
        extra: list[Sample] = []
        if self._samples is not None:
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_S):
                    got = self._samples()
                    extra = list(await got if inspect.isawaitable(got) else got)
            except TimeoutError:
                log.warning("metrics of %s timed out", self.prefix)
            except Exception as exc:  # noqa: BLE001 - partial metrics beat none; the error is logged
                log.warning("metrics of %s failed: %r", self.prefix, exc)
        return 200, render([*base, *extra]).encode()

    # --- handlers --------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        status, body = await self._health.get()
        return web.Response(
            body=body,
            status=status,
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        _, body = await self._metrics.get()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


@asynccontextmanager
async def serving(
    listen: str,
    prefix: str,
    *,
    checks: Mapping[str, Check] | None = None,
    samples: Samples | None = None,
    info: Callable[[], Mapping[str, Any]] | None = None,
) -> AsyncIterator[HealthServer | None]:
    """Run a :class:`HealthServer` on ``listen`` (``host:port``) for the block; nothing when empty."""
    if not listen:
        yield None
        return
    host, port = parse_listen(listen)
    server = HealthServer(host, port, prefix, checks=checks, samples=samples, info=info)
    await server.start()
    log.info("%s: health on %s/healthz, metrics on %s/metrics", prefix, server.url, server.url)
    try:
        yield server
    finally:
        await server.stop()


def counter_samples(
    prefix: str, counters: Mapping[str, int | float], help: str = ""
) -> list[Sample]:
    """Samples of a counter mapping: ``key`` -> ``<prefix>_<key>_total`` (counters).

    Keys ``group:label`` become one gauge ``<prefix>_<group>{name="label"}`` (e.g. the
    node's ``mailbox:echo`` queue depth).
    """
    out: list[Sample] = []
    for key, value in sorted(counters.items()):
        group, sep, label = key.partition(":")
        if sep:
            out.append(
                Sample(
                    name=f"{prefix}_{group}", value=float(value), labels={"name": label}, help=help
                )
            )
        else:
            out.append(
                Sample(name=f"{prefix}_{key}_total", value=float(value), kind="counter", help=help)
            )
    return out


def redis_writable(client: aioredis.Redis, process: str) -> Check:
    """A check that Redis takes a write, not only answers: ``SET`` of the process's
    health key (:func:`pipeline.keys.health_probe`) with an expiry. It fails with
    Redis's own refusal (``OutOfMemoryError: command not allowed when used memory >
    'maxmemory'``, ``ReadOnlyError``, ``MISCONF ...``) as well as when Redis is away."""
    key = keys.health_probe(process)

    async def check() -> None:
        await client.set(key, b"1", px=PROBE_TTL_MS)

    return check


async def bus_samples(client: aioredis.Redis) -> list[Sample]:
    """Queue depths of a bus from its Redis (seed 002 queue names): what is waiting and in flight."""
    queues = (keys.BUS_LOCAL, keys.BUS_REMOTE, keys.BUS_REPLY)
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
        pipe.llen(keys.bus_inflight(queue))
    pipe.hlen(keys.BUS_BACKLOG)
    pipe.hlen(keys.bus_outbox())
    pipe.llen(keys.bus_dead())
    values = [int(v) for v in await pipe.execute()]
    out: list[Sample] = []
    for i, queue in enumerate(queues):
        out.append(
            Sample(
                name="sluice_bus_queue_length",
                value=values[2 * i],
                labels={"queue": queue},
                help="messages waiting in a bus queue",
            )
        )
    for i, queue in enumerate(queues):
        out.append(
            Sample(
                name="sluice_bus_inflight_length",
                value=values[2 * i + 1],
                labels={"queue": queue},
                help="messages claimed from a queue and not yet handled",
            )
        )
    out.append(
        Sample(name="sluice_bus_backlog_size", value=values[-3], help="requests awaiting a reply")
    )
    out.append(
        Sample(
            name="sluice_bus_dead_length",
            value=values[-1],
            help="messages the bus set aside (unanswerable or failing): see 'sluice bus dead'",
        )
    )
    out.append(
        Sample(
            name="sluice_bus_outbox_size",
            value=values[-2],
            help="requests and replies waiting for their HTTP POST to succeed",
        )
    )
    return out


__all__ = [
    "CACHE_S",
    "CHECK_TIMEOUT_S",
    "CONTENT_TYPE",
    "HealthServer",
    "Sample",
    "bus_samples",
    "counter_samples",
    "metric_name",
    "parse_listen",
    "redis_writable",
    "render",
    "serving",
]


def forwarder_samples(
    outcomes: Mapping[tuple[str, str], int], retried: int, unreachable: Mapping[int, float]
) -> list[Sample]:
    """A bus's outbound outcomes (by kind and outcome), retries, and peers not answering."""
    out = [
        Sample(
            name="sluice_bus_outbound_total",
            value=float(count),
            kind="counter",
            labels={"kind": kind, "outcome": outcome},
            help="requests and replies POSTed to peers, by final outcome",
        )
        for (kind, outcome), count in sorted(outcomes.items())
    ]
    out.append(
        Sample(
            name="sluice_bus_retries_total",
            value=float(retried),
            kind="counter",
            help="POST attempts retried after a peer did not answer",
        )
    )
    out.append(
        Sample(
            name="sluice_bus_peers_unreachable",
            value=float(len(unreachable)),
            help="peers whose last POST got no answer",
        )
    )
    out.extend(
        Sample(
            name="sluice_bus_peer_unreachable_seconds",
            value=round(seconds, 1),
            labels={"twin": str(twin)},
            help="seconds since a peer stopped answering",
        )
        for twin, seconds in sorted(unreachable.items())
    )
    return out
