"""ConnectionLimits: the defaults of a connection, checked when built, and the keyword path."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

import pytest

from pipeline.dialogue import ConnectionLimits
from pipeline.dialogue.channel import Channel
from pipeline.dialogue.connection import Connection
from pipeline.dialogue.limits import DEFAULT_LIMITS, LimitOptions
from pipeline.dialogue.packets import DEFAULT_MAX_FRAME
from pipeline.dialogue.protocol import Role
from pipeline.dialogue.server import (
    DEFAULT_FIRST_FRAME_TIMEOUT,
    DEFAULT_FRAME_TIMEOUT,
    DialogueServer,
)
from pipeline.errors import ConfigError

FIELDS = [field.name for field in dataclasses.fields(ConnectionLimits)]
OPTIONAL = {"window", "first_frame_timeout", "frame_timeout", "idle_timeout"}


def test_the_defaults_are_the_connections() -> None:
    today = ConnectionLimits(
        max_frame=DEFAULT_MAX_FRAME,
        window=None,
        duplex_queue_bytes=1 << 20,
        max_queued_messages=1024,
        max_queued_bytes=8 << 20,
        max_handlers=256,
        write_high=1 << 18,
        close_timeout=5.0,
        end_timeout=10.0,
        first_frame_timeout=None,
        frame_timeout=None,
        idle_timeout=None,
    )
    assert today == DEFAULT_LIMITS


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("bad", [0, -1, math.nan])
def test_every_bound_must_be_positive_and_the_error_names_it(name: str, bad: float) -> None:
    with pytest.raises(ConfigError, match=rf"ConnectionLimits\.{name} must be positive"):
        ConnectionLimits(**cast(Any, {name: bad}))
    with pytest.raises(ConfigError, match=rf"ConnectionLimits\.{name} must be positive"):
        DEFAULT_LIMITS.replace(**cast(Any, {name: bad}))


@pytest.mark.parametrize("name", sorted(OPTIONAL))
def test_none_turns_an_optional_bound_off(name: str) -> None:
    assert getattr(ConnectionLimits(**cast(Any, {name: None})), name) is None


def test_frozen_slotted_keyword_only() -> None:
    limits = ConnectionLimits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_frame = 1  # type: ignore[misc]
    assert not hasattr(limits, "__dict__")
    with pytest.raises(TypeError):
        ConnectionLimits(1024)  # type: ignore[call-arg]


def test_the_keyword_names_are_the_fields() -> None:
    assert set(LimitOptions.__annotations__) == set(FIELDS)


def test_a_duplex_queue_holds_a_whole_window_and_a_frame() -> None:
    assert ConnectionLimits(duplex_queue_bytes=4096).duplex_high == 4096
    with_window = ConnectionLimits(duplex_queue_bytes=4096, window=65536, max_frame=1024)
    assert with_window.duplex_high == 65536 + 1024
    small_window = ConnectionLimits(duplex_queue_bytes=1 << 20, window=1024, max_frame=1024)
    assert small_window.duplex_high == 1 << 20


NO_CHANNEL = cast(Channel, object())  # a connection touches its channel only once started


async def test_a_connection_takes_its_limits() -> None:
    limits = ConnectionLimits(window=4096, close_timeout=1.5, end_timeout=2.5, write_high=100)
    conn = Connection(NO_CHANNEL, Role.CLIENT, limits=limits)
    assert conn.limits is limits
    assert (conn.close_timeout, conn.end_timeout) == (1.5, 2.5)
    assert conn.protocol.window == 4096
    assert Connection(NO_CHANNEL, Role.SERVER).limits is DEFAULT_LIMITS


async def test_the_old_keywords_still_work_applied_over_the_limits() -> None:
    conn = Connection(NO_CHANNEL, Role.CLIENT, window=4096, idle_timeout=3.0)
    assert conn.limits == ConnectionLimits(window=4096, idle_timeout=3.0)
    base = ConnectionLimits(window=4096, max_handlers=8)
    conn = Connection(NO_CHANNEL, Role.CLIENT, limits=base, max_handlers=16)
    assert conn.limits == ConnectionLimits(window=4096, max_handlers=16)
    assert conn.protocol.max_frame == DEFAULT_MAX_FRAME
    with pytest.raises(ConfigError, match="max_handlers"):
        Connection(NO_CHANNEL, Role.CLIENT, max_handlers=0)


def test_a_server_turns_the_hostile_client_deadlines_on_by_default() -> None:
    server = DialogueServer("127.0.0.1", 0, close_timeout=2.0)
    assert server.limits == ConnectionLimits(
        close_timeout=2.0,
        first_frame_timeout=DEFAULT_FIRST_FRAME_TIMEOUT,
        frame_timeout=DEFAULT_FRAME_TIMEOUT,
    )
    given = ConnectionLimits(idle_timeout=9.0)
    assert DialogueServer("127.0.0.1", 0, limits=given).limits is given
