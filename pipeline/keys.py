"""Every Redis key name Sluice uses, built here and nowhere else.

Sluice's own keys start ``sluice:`` and put the stream name in a hash tag
(``sluice:{name}:...``) so all keys of one stream land in one Redis Cluster
slot. The reliable message bus keeps the seed's ``msgbus.*`` names exactly.
"""

from __future__ import annotations

from pipeline.errors import ConfigError

_FORBIDDEN = set("{}\r\n ")


def _check(name: str) -> str:
    if not name or len(name) > 200 or any(ch in _FORBIDDEN for ch in name):
        raise ConfigError(f"invalid stream name {name!r}")
    return name


# --- streams (stream service, stream transport, chain streams) -------------


def stream(name: str) -> str:
    """The Redis stream holding the entries of logical stream ``name``."""
    return f"sluice:{{{_check(name)}}}:stream"


def stream_name(key: str) -> str:
    """Inverse of :func:`stream`."""
    prefix, suffix = "sluice:{", "}:stream"
    if not (key.startswith(prefix) and key.endswith(suffix)):
        raise ConfigError(f"not a sluice stream key: {key!r}")
    return key[len(prefix) : -len(suffix)]


def dead_letter(name: str) -> str:
    """Where a consumer moves entries whose handler kept failing."""
    return f"sluice:{{{_check(name)}}}:dead"


def consumer_index(name: str) -> str:
    """Hash: client id -> last processed entry id (monotonic)."""
    return f"sluice:{{{_check(name)}}}:index"


def push_dedup(name: str, request_id: str) -> str:
    """Remembers the entry id of a push, so a repeated request id is idempotent."""
    return f"sluice:{{{_check(name)}}}:push:{request_id}"


def consumer_lease(name: str) -> str:
    """Lease key: which node consumes this stream."""
    return f"sluice:{{{_check(name)}}}:lease"


def failures(name: str) -> str:
    """Hash: entry id -> handler failure count."""
    return f"sluice:{{{_check(name)}}}:failures"


def streams_registry() -> str:
    """Set of logical stream names created through the stream service."""
    return "sluice:streams"


def health_probe(process: str) -> str:
    """Written (with a short expiry) by ``/healthz`` of ``process`` to prove Redis takes writes.

    One key per process, its name in a hash tag: a single-key command, valid on a Cluster.
    Any process name works (a character a key cannot hold becomes ``_``).
    """
    safe = "".join("_" if ch in _FORBIDDEN else ch for ch in process[:200]) or "_"
    return f"sluice:health:{{{safe}}}"


# --- lake --------------------------------------------------------------------


def archive_lock(name: str, lake: str) -> str:
    """Held while one interval of ``name`` is archived into the lake ``lake`` or trimmed.

    ``lake`` names the lake (any text; :mod:`pipeline.lake.lock` gives a digest of
    its address): two lakes archiving one stream do not wait for each other.
    """
    return f"sluice:{{{_check(name)}}}:archive-lock:{lake}"


# --- reliable message bus (seed 002 names, unchanged) ------------------------

BUS_LOCAL = "msgbus.system.local"
BUS_REMOTE = "msgbus.system.remote"
BUS_REPLY = "msgbus.system.reply"
BUS_BACKLOG = "msgbus.system.backlog"


def bus_command(cmd: str) -> str:
    """The queue a handler of ``cmd`` pops requests from."""
    if not cmd:
        raise ConfigError("empty bus command")
    return f"msgbus.{cmd}"


def bus_counter(dst: int) -> str:
    """Per-destination counter for uids ``dst.counter``."""
    return f"msgbus.system.counter.{dst}"


def bus_seen() -> str:
    """Sorted set of request uids seen from peers (score = expiry), for replay protection."""
    return "msgbus.system.seen"


def bus_expiry() -> str:
    """Sorted set of backlog uids by expiry time, swept by the scrubber."""
    return "msgbus.system.expiry"


def bus_directory() -> str:
    """Hash: twin id -> JSON {url, key} (the Redis form of the twin directory)."""
    return "msgbus.system.directory"


def bus_inflight(queue: str) -> str:
    """Processing list where the bus moves what it popped from ``queue`` until it is handled."""
    return f"{queue}.inflight"


def bus_outbox() -> str:
    """Hash: outbound id -> JSON of a request or reply waiting for its HTTP POST to succeed."""
    return "msgbus.system.outbox"


def bus_dead() -> str:
    """List of messages the bus set aside (newest first), each ``<JSON header>\\n<message>``.

    The header says where the message came from (``queue``), ``reason``, ``at``
    (epoch s), ``attempts``, ``size`` and ``truncated``; see :mod:`pipeline.bus.dead`.
    """
    return "msgbus.system.dead"


def bus_replicated() -> str:
    """Counter the bus increments after a batch's transaction so that a ``WAIT`` beside the
    increment covers that transaction (``SLUICE_REDIS_MIN_REPLICAS``; see
    :meth:`pipeline.bus.store.BusStore.replicated`)."""
    return "msgbus.system.replicated"


def bus_handling(server: str) -> str:
    """List of the requests one bus server (an SDK handler process) took and has not
    answered yet; a server that stops renewing :func:`bus_handlers` has its list
    handed to a handler again (see :mod:`pipeline.bus.handling`)."""
    return f"msgbus.system.handling.{server}"


def bus_handlers() -> str:
    """Hash: bus server id -> the epoch second until which it is alive (renewed)."""
    return "msgbus.system.handlers"


def bus_redelivered() -> str:
    """Hash: sha1 of a request -> times it was handed to a handler again after one died."""
    return "msgbus.system.redelivered"


def bus_attempts() -> str:
    """Hash: ``<queue>:<digest of a message>`` -> times the bus started handling it."""
    return "msgbus.system.attempts"
