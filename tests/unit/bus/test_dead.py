from __future__ import annotations

import json

import pytest

from pipeline.bus import dead


def test_entry_round_trips_any_bytes():
    body = b"\xff\x00 not json \n with a newline"
    letter = dead.parse(dead.entry("msgbus.system.local", "why", body, attempts=3))
    assert (letter.queue, letter.reason, letter.attempts, letter.body) == (
        "msgbus.system.local",
        "why",
        3,
        body,
    )
    assert letter.size == len(body) and not letter.truncated


def test_large_bodies_are_cut_and_marked():
    body = b"x" * (dead.BODY_MAX + 10)
    letter = dead.parse(dead.entry("q", "r" * 5000, body))
    assert letter.truncated and letter.size == len(body) and len(letter.body) == dead.BODY_MAX
    assert len(letter.reason) == 1000


def test_header_is_one_json_line():
    raw = dead.entry("q", "line one\nline two", b"{}")
    head, _, _ = raw.partition(b"\n")
    assert json.loads(head)["reason"] == "line one\nline two"


@pytest.mark.parametrize("raw", [b"", b"no newline", b"[1]\nbody", b"{bad\nbody"])
def test_parse_refuses_what_is_not_an_entry(raw):
    with pytest.raises(ValueError):
        dead.parse(raw)


def test_parse_of_a_bomb_is_a_value_error():
    with pytest.raises(ValueError):
        dead.parse(b"[" * 100_000 + b"\nbody")
