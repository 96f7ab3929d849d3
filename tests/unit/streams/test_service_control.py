"""The stream service's control table covers every request the protocol defines."""

from __future__ import annotations

import typing

from pipeline.streams import protocol as p
from pipeline.streams.servicecontrol import _CONTROL


def test_every_request_but_push_and_pull_has_a_control_handler() -> None:
    requests = {cls for cls in typing.get_args(p.StreamMessage) if cls not in p._REPLIES} - {
        p.Push,
        p.Pull,
    }
    assert set(_CONTROL) == requests


def test_no_reply_is_handled_as_a_request() -> None:
    assert not set(_CONTROL) & set(p._REPLIES)
