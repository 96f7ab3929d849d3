from __future__ import annotations

import json

import pytest

from pipeline.chain import jsonrpc
from pipeline.chain.jsonrpc import Request, RpcError, parse_request


def test_valid_request() -> None:
    req = parse_request('{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}')
    assert req == Request(id=1, method="m", params=[1])


def test_notification_has_no_id() -> None:
    req = parse_request('{"jsonrpc":"2.0","method":"m"}')
    assert isinstance(req, Request) and req.is_notification and req.params == []


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", jsonrpc.PARSE_ERROR),
        (b"\xff\xfe", jsonrpc.PARSE_ERROR),
        ("[]", jsonrpc.INVALID_REQUEST),
        ("3", jsonrpc.INVALID_REQUEST),
        ('{"jsonrpc":"1.0","id":1,"method":"m"}', jsonrpc.INVALID_REQUEST),
        ('{"jsonrpc":"2.0","id":1}', jsonrpc.INVALID_REQUEST),
        ('{"jsonrpc":"2.0","id":{},"method":"m"}', jsonrpc.INVALID_REQUEST),
        ('{"jsonrpc":"2.0","id":1,"method":"m","params":3}', jsonrpc.INVALID_REQUEST),
    ],
)
def test_bad_requests(text, code) -> None:
    err = parse_request(text)
    assert isinstance(err, RpcError) and err.code == code
    reply = json.loads(err.encode())
    assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] == code


def test_notification_shape_and_parse() -> None:
    text = jsonrpc.notification("cardinal_subscribe", "0x1", '{"type":"batch"}')
    assert json.loads(text) == {
        "jsonrpc": "2.0",
        "method": "cardinal_subscribe",
        "params": {"subscription": "0x1", "result": {"type": "batch"}},
    }
    assert jsonrpc.parse_notification(text) == ("0x1", {"type": "batch"})
    assert jsonrpc.parse_notification(jsonrpc.result(1, "0x1")) is None
