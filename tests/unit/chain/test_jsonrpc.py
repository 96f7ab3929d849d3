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


# --- batch arrays -------------------------------------------------------------

REQ = '{"jsonrpc":"2.0","id":%d,"method":"m","params":[%d]}'


def test_a_request_alone_is_still_a_request() -> None:
    assert jsonrpc.parse_message(REQ % (1, 1)) == Request(id=1, method="m", params=[1])


def test_a_batch_of_mixed_valid_and_invalid_elements_keeps_their_order() -> None:
    text = (
        "[" + REQ % (1, 1) + ',{"jsonrpc":"2.0","method":"n"},7,'
        '{"jsonrpc":"1.0","id":"x","method":"m"},{"jsonrpc":"2.0","id":3},'
        '{"jsonrpc":"2.0","id":4,"method":"m","params":3},' + REQ % (5, 5) + "]"
    )
    out = jsonrpc.parse_message(text)
    assert isinstance(out, jsonrpc.Batch)
    one, note, seven, old, nameless, params, five = out.items
    assert one == Request(id=1, method="m", params=[1])
    assert isinstance(note, Request) and note.is_notification and note.method == "n"
    assert seven == RpcError(code=jsonrpc.INVALID_REQUEST, message="a request is a JSON object")
    assert isinstance(old, RpcError) and old.id == "x" and old.code == jsonrpc.INVALID_REQUEST
    assert isinstance(nameless, RpcError) and nameless.id == 3
    assert isinstance(params, RpcError) and params.id == 4 and "params" in params.message
    assert five == Request(id=5, method="m", params=[5])


@pytest.mark.parametrize("text", ["[]", " [ ] ", "\n[\t]"])
def test_an_empty_batch_is_one_invalid_request(text: str) -> None:
    out = jsonrpc.parse_message(text)
    assert isinstance(out, RpcError) and out.code == jsonrpc.INVALID_REQUEST and out.id is None
    assert "empty batch" in out.message
    assert json.loads(out.encode())["error"]["code"] == jsonrpc.INVALID_REQUEST  # one object


def test_a_batch_of_the_most_elements_is_parsed_and_one_more_is_refused() -> None:
    most = "[" + ",".join(REQ % (i, i) for i in range(jsonrpc.MAX_BATCH)) + "]"
    out = jsonrpc.parse_message(most)
    assert isinstance(out, jsonrpc.Batch) and len(out.items) == jsonrpc.MAX_BATCH
    assert [r.id for r in out.items if isinstance(r, Request)] == list(range(jsonrpc.MAX_BATCH))
    over = "[" + ",".join(REQ % (i, i) for i in range(jsonrpc.MAX_BATCH + 1)) + "]"
    refused = jsonrpc.parse_message(over)
    assert isinstance(refused, RpcError) and refused.code == jsonrpc.INVALID_REQUEST
    assert refused.message == f"batch of {jsonrpc.MAX_BATCH + 1} requests: at most 64"
    thousand = jsonrpc.parse_message("[" + ",".join(["{}"] * 1000) + "]")
    assert isinstance(thousand, RpcError) and "1000" in thousand.message


def test_an_oversized_batch_is_refused_before_decoding() -> None:
    pad = " " * jsonrpc.MAX_CHARS
    out = jsonrpc.parse_message("[" + REQ % (1, 1) + pad + "]")
    assert isinstance(out, RpcError) and out.code == jsonrpc.INVALID_REQUEST
    assert str(jsonrpc.MAX_CHARS) in out.message


def test_elements_are_bounded_in_depth_like_a_lone_request() -> None:
    deepest = "[" * (jsonrpc.MAX_DEPTH - 1) + "]" * (jsonrpc.MAX_DEPTH - 1)
    element = '{"jsonrpc":"2.0","id":1,"method":"m","params":%s}'
    assert isinstance(parse_request(element % deepest), Request)
    out = jsonrpc.parse_message("[" + element % deepest + "]")
    assert isinstance(out, jsonrpc.Batch) and isinstance(out.items[0], Request)
    deeper = "[" + deepest + "]"
    assert isinstance(parse_request(element % deeper), RpcError)
    bomb = jsonrpc.parse_message("[" + REQ % (1, 1) + "," + element % deeper + "]")
    assert isinstance(bomb, RpcError) and bomb.code == jsonrpc.PARSE_ERROR
    assert bomb.message == f"parse error: nested deeper than {jsonrpc.MAX_DEPTH} in a batch element"


def test_the_extra_level_is_only_for_an_array() -> None:
    inner = "[" * jsonrpc.MAX_DEPTH + "]" * jsonrpc.MAX_DEPTH  # the object makes it 33
    out = jsonrpc.parse_message(f'{{"jsonrpc":"2.0","id":1,"method":"m","params":{inner}}}')
    assert isinstance(out, RpcError) and out.code == jsonrpc.PARSE_ERROR


def test_parse_request_refuses_a_batch() -> None:
    out = parse_request("[" + REQ % (1, 1) + "]")
    assert isinstance(out, RpcError) and out.code == jsonrpc.INVALID_REQUEST


def test_batch_reply_is_one_array_or_nothing() -> None:
    texts = [jsonrpc.result(1, "a"), jsonrpc.error(None, jsonrpc.INVALID_REQUEST, "x")]
    reply = jsonrpc.batch_reply(texts)
    assert reply is not None and [r.get("id") for r in json.loads(reply)] == [1, None]
    assert jsonrpc.batch_reply([]) is None
