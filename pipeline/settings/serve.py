"""The ``serve`` section: the resumption server's address, feed, buffers, caches and bounds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.settings.fields import (
    NonEmpty,
    Port,
    PositiveFloat,
    PositiveInt,
    check,
    flat_of,
    invalid,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    """The resumption server (``sluice serve``)."""

    _SECTION: ClassVar[str] = "serve"

    host: NonEmpty = "127.0.0.1"
    port: Port = 8765
    stream: NonEmpty = "chain:demo"
    token: str = ""
    send_buffer: PositiveInt = 4096
    #: Seconds between websocket pings (0: none).
    heartbeat_s: float = 20.0
    #: TCP port of the same feed over Dialogue duplexes (0: off).
    dialogue_port: Port = 0
    #: Decoded lake history kept in memory (MiB, LRU by data file; 0: off).
    history_cache_mb: int = 512
    #: Seconds a cached history file may go unused before it is dropped (its memory given back).
    cache_idle_s: PositiveFloat = 60.0
    #: Seconds between two looks of the memory releaser (longer after fruitless releases).
    release_every_s: PositiveFloat = 10.0
    #: Redis tail entries indexed by block number (about 0.7 KB each); older ones come from the lake.
    tail_index_max: int = 500_000
    #: HTTP connections open at once (more: answered 503 and closed).
    max_connections: PositiveInt = 1024
    #: Seconds a connection may take to send a complete request head (the websocket upgrade).
    header_timeout_s: PositiveFloat = 10.0
    #: Seconds a catching-up subscriber's full send buffer may stay full (then: closed, 1008).
    stall_s: PositiveFloat = 30.0

    def __post_init__(self) -> None:
        # history_cache_mb (non-negative, 0: off) is checked here with every number.
        check(self)
        if self.dialogue_port and self.dialogue_port == self.port:
            raise invalid(
                self,
                "dialogue_port",
                f"must differ from {flat_of(self, 'port')} (both {self.port})",
            )
