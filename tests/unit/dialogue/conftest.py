"""Two sans-IO Dialogue machines wired back to back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pipeline.dialogue.events import Event
from pipeline.dialogue.protocol import Dialogue, Role


class Pair:
    """A client and a server machine; :meth:`pump` carries bytes until both are quiet."""

    def __init__(self, **options: object) -> None:
        self.client = Dialogue(Role.CLIENT, **options)  # type: ignore[arg-type]
        self.server = Dialogue(Role.SERVER, **options)  # type: ignore[arg-type]
        self.client_events: list[Event] = []
        self.server_events: list[Event] = []
        self.pump()
        self.client_events.clear()
        self.server_events.clear()

    def pump(self) -> tuple[list[Event], list[Event]]:
        """Deliver everything; return the new (client, server) events."""
        new_c: list[Event] = []
        new_s: list[Event] = []
        for _ in range(100):
            to_server = self.client.data_to_send()
            to_client = self.server.data_to_send()
            if to_server:
                self.server.receive_data(to_server)
            if to_client:
                self.client.receive_data(to_client)
            new_c += self.client.events_received()
            new_s += self.server.events_received()
            if not to_server and not to_client:
                break
        self.client_events += new_c
        self.server_events += new_s
        return new_c, new_s


@pytest.fixture
def make_pair() -> Callable[..., Pair]:
    return Pair


@pytest.fixture
def pair() -> Pair:
    return Pair()
