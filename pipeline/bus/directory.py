"""The twin directory: twin id -> base URL and Ed25519 public key.

Two sources, same content:

* a file, JSON or TOML, mapping twin ids to ``{url, key}``; entries may sit at
  the top level or under a ``twins`` table::

      {"1001": {"url": "http://127.0.0.1:8051", "key": "<base64 public key>"}}

      [twins.1002]
      url = "http://127.0.0.1:8052"
      key = "<base64 public key>"

* the Redis hash ``msgbus.system.directory``: field = twin id, value = the same
  ``{url, key}`` JSON object. Entries are cached for a few seconds.

``key`` may be empty only for legacy peers (their requests are unsigned).
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.signing import Verifier
from pipeline.errors import ConfigError

CACHE_TTL_S = 5.0
CACHE_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Peer:
    """One twin: where its bus listens and how to check its signatures."""

    twin: int
    url: str
    key: str
    verifier: Verifier | None

    @classmethod
    def parse(cls, twin: Any, doc: Any) -> Peer:
        try:
            twin_id = int(twin)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"twin directory: {twin!r} is not a twin id") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("url"), str) or not doc["url"]:
            raise ConfigError(f"twin directory: twin {twin_id} needs a url")
        url = doc["url"].rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"twin directory: twin {twin_id} url must be http(s)://")
        key = doc.get("key", "") or ""
        if not isinstance(key, str):
            raise ConfigError(f"twin directory: twin {twin_id} key must be base64 text")
        return cls(twin_id, url, key, Verifier(key) if key else None)

    def to_json(self) -> str:
        return json.dumps({"url": self.url, "key": self.key})


class Directory(Protocol):
    async def lookup(self, twin: int) -> Peer | None:
        """The peer for ``twin``, or None when the directory does not know it."""
        ...


def parse_document(doc: Any) -> dict[int, Peer]:
    if not isinstance(doc, dict):
        raise ConfigError("twin directory must be a mapping of twin id -> {url, key}")
    entries = doc.get("twins", doc)
    if not isinstance(entries, dict):
        raise ConfigError("twin directory: 'twins' must be a table")
    peers = [Peer.parse(twin, entry) for twin, entry in entries.items()]
    return {p.twin: p for p in peers}


class FileDirectory:
    """A directory read once from a JSON or TOML file."""

    def __init__(self, peers: dict[int, Peer]) -> None:
        self.peers = peers

    @classmethod
    def load(cls, path: str | Path) -> FileDirectory:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read twin directory {path}: {exc}") from exc
        try:
            doc = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"twin directory {path}: {exc}") from exc
        return cls(parse_document(doc))

    async def lookup(self, twin: int) -> Peer | None:
        return self.peers.get(twin)


class RedisDirectory:
    """A directory in the Redis hash ``msgbus.system.directory``, cached ``CACHE_TTL_S``."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._cache: dict[int, tuple[float, Peer | None]] = {}

    async def lookup(self, twin: int) -> Peer | None:
        hit = self._cache.get(twin)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        raw = await self._redis.hget(keys.bus_directory(), str(twin))
        peer: Peer | None = None
        if raw is not None:
            try:
                peer = Peer.parse(twin, json.loads(raw))
            except (ValueError, RecursionError, ConfigError):
                peer = None  # a broken entry is "not found": the caller gets an err
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[twin] = (now + CACHE_TTL_S, peer)
        return peer

    @staticmethod
    async def register(client: aioredis.Redis, twin: int, url: str, key: str) -> None:
        """Add or replace one twin in the Redis directory."""
        peer = Peer.parse(twin, {"url": url, "key": key})
        await client.hset(keys.bus_directory(), str(twin), peer.to_json())
