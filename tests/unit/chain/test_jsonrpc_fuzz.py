"""The JSON-RPC decoder under hostile input: it never raises, never recurses, and is bounded."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.chain import jsonrpc
from pipeline.chain.jsonrpc import (
    INVALID_REQUEST,
    MAX_BATCH,
    MAX_CHARS,
    MAX_DEPTH,
    Batch,
    Request,
    RpcError,
    loads_bounded,
    nesting_within,
    parse_message,
    parse_notification,
    parse_request,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**300), max_value=2**300)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_any_text_gives_a_request_or_an_error(text: str) -> None:
    assert isinstance(parse_request(text), Request | RpcError)
    _check_message(parse_message(text))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_request_or_an_error(data: bytes) -> None:
    assert isinstance(parse_request(data), Request | RpcError)
    _check_message(parse_message(data))
    _check_message(parse_message(b"[" + data + b"]"))


def _check_message(out: object) -> None:
    """What parse_message may return: a request, an error, or a bounded batch of those."""
    if isinstance(out, Batch):
        assert 1 <= len(out.items) <= MAX_BATCH
        assert all(isinstance(item, Request | RpcError) for item in out.items)
    else:
        assert isinstance(out, Request | RpcError)
        if isinstance(out, RpcError):
            json.loads(out.encode())


@settings(max_examples=300, deadline=None)
@given(st.lists(json_values, max_size=8) | st.text(alphabet='[]{},1" :', max_size=80))
def test_any_array_or_bracket_soup_never_raises(value: object) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    _check_message(parse_message(text))
    _check_message(parse_message("[" + text))


requests = st.dictionaries(
    st.sampled_from(["jsonrpc", "id", "method", "params", "extra"]),
    json_values | st.sampled_from(["2.0", "m", "cardinal_subscribe"]),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(requests | json_values, min_size=1, max_size=8))
def test_each_batch_element_is_parsed_exactly_like_a_lone_request(elements: list[object]) -> None:
    out = parse_message(json.dumps(elements))
    assert isinstance(out, Batch) and len(out.items) == len(elements)
    for element, item in zip(elements, out.items, strict=True):
        if isinstance(element, list):  # alone it would be a batch; in one, no request
            assert item == RpcError(code=INVALID_REQUEST, message="a request is a JSON object")
            continue
        alone = parse_request(json.dumps(element))
        assert item == alone, (element, item, alone)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["jsonrpc", "id", "method", "params", "extra"]), json_values, max_size=5
    )
)
def test_wrong_types_in_every_field(obj: dict[str, object]) -> None:
    out = parse_request(json.dumps(obj))
    if isinstance(out, Request):
        assert obj["jsonrpc"] == "2.0" and isinstance(out.method, str) and out.method
        assert isinstance(out.params, list | dict)
    else:
        assert out.code in (jsonrpc.INVALID_REQUEST, jsonrpc.PARSE_ERROR)
        json.loads(out.encode())  # the reply is valid JSON whatever the id was


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_nesting_scan_agrees_with_the_real_depth(value: object) -> None:
    text = json.dumps(value)

    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    real = depth(value)
    for limit in (0, 1, 2, 3, 5):
        assert nesting_within(text, limit) == (real <= limit), (text, limit)


@pytest.mark.parametrize("opener", ["[", "{", '{"a":', "[1,", '[{"a":'])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 100_000])
def test_nesting_bombs_are_refused_without_recursion(opener: str, depth: int) -> None:
    closer = {"[": "]", "{": "}", '{"a":': "}", "[1,": "]", '[{"a":': "}]"}[opener]
    bomb = opener * depth + "1" + closer * depth
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # json.loads would need ``depth`` frames: it must never be reached
    try:
        out = parse_request(bomb, max_chars=len(bomb))
        as_message = parse_message(bomb, max_chars=len(bomb))
        with pytest.raises(ValueError):
            loads_bounded(bomb)
        assert parse_notification(bomb) is None
    finally:
        sys.setrecursionlimit(limit)
    assert isinstance(out, RpcError) and out.code == jsonrpc.PARSE_ERROR
    assert "nested deeper" in out.message
    if opener in ("[", "[1,") and depth == MAX_DEPTH + 1:  # a batch: its array is one more
        assert isinstance(as_message, Batch) and as_message.items[0].code == INVALID_REQUEST
    else:
        assert isinstance(as_message, RpcError) and as_message.code == jsonrpc.PARSE_ERROR
        assert "nested deeper" in as_message.message


@pytest.mark.parametrize("depth", [MAX_DEPTH, 1_000, 100_000])
def test_nesting_bombs_inside_batch_elements_are_refused_without_recursion(depth: int) -> None:
    good = '{"jsonrpc":"2.0","id":1,"method":"m"}'
    bomb = "[" + good + ',{"jsonrpc":"2.0","id":2,"method":"m","params":' + "[" * depth
    bomb += "]" * depth + "}]"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        out = parse_message(bomb, max_chars=len(bomb))
    finally:
        sys.setrecursionlimit(limit)
    assert isinstance(out, RpcError) and out.code == jsonrpc.PARSE_ERROR
    assert "in a batch element" in out.message


@pytest.mark.parametrize(
    "bomb",
    [
        "[" * 100_000,  # unbalanced
        "[" * 50_000 + '"' + "]" * 50_000,  # an unterminated string hides the closers
        '"' + '\\"' * 40_000 + "[" * 1000,  # escaped quotes
        "[]" * 20_000 + "[" * 100,
        "{" * 30_000 + "]" * 30_000,  # mismatched
    ],
)
def test_malformed_bombs_are_parse_errors(bomb: str) -> None:
    out = parse_request(bomb, max_chars=len(bomb))
    assert isinstance(out, RpcError) and out.code == jsonrpc.PARSE_ERROR
    out = parse_message(bomb, max_chars=len(bomb))
    assert isinstance(out, RpcError) and out.code == jsonrpc.PARSE_ERROR


def test_depth_at_the_limit_is_accepted_and_one_more_is_not() -> None:
    inner = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    ok = parse_request(f'{{"jsonrpc":"2.0","id":1,"method":"m","params":{inner}}}')
    assert isinstance(ok, Request)
    inner = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    deep = parse_request(f'{{"jsonrpc":"2.0","id":1,"method":"m","params":{inner}}}')
    assert isinstance(deep, RpcError) and deep.code == jsonrpc.PARSE_ERROR


def test_brackets_inside_strings_do_not_count() -> None:
    text = '{"jsonrpc":"2.0","id":"[[[[","method":"m","params":["' + "[{" * 5000 + '\\"]"]}'
    out = parse_request(text)
    assert isinstance(out, Request) and out.id == "[[[["


def test_size_just_over_the_limit() -> None:
    pad = " " * MAX_CHARS
    body = '{"jsonrpc":"2.0","id":1,"method":"m"}'
    at_limit = body + pad[: MAX_CHARS - len(body)]
    assert len(at_limit) == MAX_CHARS
    assert isinstance(parse_request(at_limit), Request)
    over = at_limit + " "
    out = parse_request(over)
    assert isinstance(out, RpcError) and out.code == jsonrpc.INVALID_REQUEST
    assert str(MAX_CHARS) in out.message


@pytest.mark.parametrize("number", [2**63 - 1, 2**63, 2**64, 2**256, -(2**256)])
def test_big_numbers_as_id_and_params(number: int) -> None:
    out = parse_request(f'{{"jsonrpc":"2.0","id":{number},"method":"m","params":[{number}]}}')
    assert isinstance(out, Request) and out.id == number and out.params == [number]
    json.loads(jsonrpc.error(out.id, jsonrpc.INVALID_PARAMS, "x"))


def test_huge_integer_literal_is_a_parse_error() -> None:
    out = parse_request('{"jsonrpc":"2.0","id":' + "9" * 5000 + ',"method":"m"}')
    assert isinstance(out, RpcError) and out.code == jsonrpc.PARSE_ERROR
