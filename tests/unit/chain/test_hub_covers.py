"""WebsocketHub.covers: whether a listener added now misses nothing after an entry id."""

from __future__ import annotations

from pipeline.chain.produce.producer import WebsocketHub


def test_a_hub_covers_only_ids_its_feed_has_not_read_past() -> None:
    hub = WebsocketHub()
    assert not hub.covers(b"5-0")  # no feed: unknown
    hub.read_to = b"5-1"
    assert hub.covers(b"5-1") and hub.covers(b"6-0") and hub.covers(b"10-0")
    assert not hub.covers(b"5-0")  # entry 5-1 was published already: a listener missed it
    hub.read_to = b"0-0"  # a tailer started on an empty stream
    assert hub.covers(b"0-0")
