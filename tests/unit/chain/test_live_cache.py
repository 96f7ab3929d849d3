"""Live fan-out cache: shared notification texts, same bytes, bounded."""

from __future__ import annotations

import json

import pytest

from pipeline.chain import subscription
from pipeline.chain.planning import Emit
from pipeline.chain.subscription import Outbox, Subscription, parse_subscribe

HASH = "0x" + "00" * 32


class _Recorded:
    """A subscription whose queued texts are appended to ``sent`` after each put."""

    def __init__(self, sub_id: str, sent: list[list[bytes]], envelope: bool) -> None:
        self.box = Outbox(8)
        params = parse_subscribe(["streams", "0x0", HASH, []])
        self.sub = Subscription(sub_id, params, self.box, envelope=envelope)
        self.sent = sent

    def put_nowait(self, emits: list[Emit]) -> None:
        self.sub.put_nowait(emits)
        self.sent.append(self.box.pop_many(100))


def _sub(sub_id: str, sent: list[list[bytes]], *, envelope: bool = True) -> _Recorded:
    return _Recorded(sub_id, sent, envelope)


def test_live_texts_are_shared_and_in_the_seed_shape() -> None:
    result = '{"type":"batch","num":"0x1"}'
    emit = Emit(1, "aa", "bb", [result])
    a: list[list[bytes]] = []
    b: list[list[bytes]] = []
    c: list[list[bytes]] = []
    _sub("0x1", a).put_nowait([emit])
    _sub("0x1", b).put_nowait([emit])  # same id on another connection
    _sub("0x2", c).put_nowait([emit])
    assert a[0][0] is b[0][0]
    for texts, sub_id in ((a, "0x1"), (c, "0x2")):
        obj = json.loads(texts[0][0])
        assert obj == {
            "jsonrpc": "2.0",
            "method": "cardinal_subscribe",
            "params": {"subscription": sub_id, "result": json.loads(result)},
        }
    bare: list[list[bytes]] = []
    _sub("0x1", bare, envelope=False).put_nowait([emit])
    assert bare[0] == [result.encode()]


def test_live_text_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscription, "LIVE_CACHE_LIMIT", 3)
    monkeypatch.setattr(subscription, "_LIVE_TEXTS", {})
    sent: list[list[bytes]] = []
    sub = _sub("0x1", sent)
    for n in range(10):
        sub.put_nowait([Emit(n, "aa", "bb", [f'{{"n":{n}}}'])])
        assert len(subscription._LIVE_TEXTS) <= 3
    assert [json.loads(t[0])["params"]["result"]["n"] for t in sent] == list(range(10))
    big = '{"k":"' + "x" * subscription.LIVE_CACHE_MAX_CHARS + '"}'
    sub.put_nowait([Emit(11, "aa", "bb", [big])])
    assert json.loads(sent[-1][0])["params"]["result"] == json.loads(big)
    assert all(
        len(t) <= subscription.LIVE_CACHE_MAX_CHARS + 200 for t in subscription._LIVE_TEXTS.values()
    )
