"""JSON-RPC 2.0: the pure codec of the websocket endpoint (no I/O).

:func:`parse_request` turns one text frame into a :class:`Request` or a
:class:`RpcError` that carries the standard code; it never raises. It is
bounded before it allocates: a text longer than ``max_chars`` or nested deeper
than ``max_depth`` (found by a linear pre-scan of the raw text, so Python's
recursive JSON decoder is never reached with a bomb) is refused as it is. The
encoders return JSON texts ready to send. Subscription notifications are
built by string concatenation around a pre-encoded result, so a block encoded
once is shared by every subscriber.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: Server-defined (-32000 to -32099): the request was valid but cannot be served.
SERVER_ERROR = -32000
#: cardinal-rpc's code for an error a method returned (e.g. ``cardinal_streamsBlock``'s
#: "block not found").
HANDLER_ERROR = -1
UNAUTHORIZED = -32001

_dumps = json.JSONEncoder(separators=(",", ":")).encode

#: Longest request text, in characters (the server's websocket frame limit is in bytes).
MAX_CHARS = 64 * 1024
#: Deepest nesting of arrays and objects in a request (ours need 3).
MAX_DEPTH = 32

# A JSON string (an unterminated one runs to the end: the match never fails, so
# the scan stays linear), everything that is not a bracket, an innermost pair.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_PAIR = re.compile(r"\[\]|\{\}")
_RUNS: dict[int, re.Pattern[str]] = {}


def nesting_within(text: str, limit: int) -> bool:
    """True when the brackets of ``text`` (outside strings) nest at most ``limit`` deep.

    Regular expressions only (no Python loop over characters): strings and
    scalars are cut away, then innermost pairs are removed at most ``limit``
    times, stopping early at a run of more than ``limit`` openers. Unbalanced
    brackets count as too deep (the text is not JSON anyway).
    """
    if text.count("[") + text.count("{") <= limit:
        return True
    run = _RUNS.get(limit)
    if run is None:
        run = _RUNS.setdefault(limit, re.compile(rf"[\[{{]{{{limit + 1}}}"))
    rest = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(limit):
        if not rest:
            return True
        if run.search(rest):
            return False
        rest, removed = _PAIR.subn("", rest)
        if not removed:
            return False
    return not rest


def loads_bounded(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that refuses nesting deeper than ``max_depth`` first (``ValueError``)."""
    if isinstance(text, bytes):
        text = text.decode()
    if not nesting_within(text, max_depth):
        raise ValueError(f"nested deeper than {max_depth}")
    try:
        return json.loads(text)
    except RecursionError as exc:  # unreachable after the pre-scan; never let it escape
        raise ValueError("nested too deep") from exc


RequestId = str | int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    id: RequestId
    method: str
    params: list[Any] | dict[str, Any]
    #: A notification (no ``id`` member) gets no response.
    is_notification: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RpcError:
    code: int
    message: str
    id: RequestId = None

    def encode(self) -> str:
        return error(self.id, self.code, self.message)


def parse_request(
    text: str | bytes, *, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH
) -> Request | RpcError:
    """One frame to a request, or the error to answer with (never raises)."""
    if len(text) > max_chars:
        return RpcError(code=INVALID_REQUEST, message=f"request longer than {max_chars} characters")
    try:
        obj = loads_bounded(text, max_depth)
    except (ValueError, UnicodeDecodeError) as exc:
        return RpcError(code=PARSE_ERROR, message=f"parse error: {exc}")
    if isinstance(obj, list):
        return RpcError(code=INVALID_REQUEST, message="batch requests are not supported")
    if not isinstance(obj, dict):
        return RpcError(code=INVALID_REQUEST, message="a request is a JSON object")
    has_id = "id" in obj
    req_id = obj.get("id")
    if req_id is not None and (isinstance(req_id, bool) or not isinstance(req_id, str | int)):
        return RpcError(code=INVALID_REQUEST, message="id must be a string, a number or null")
    if obj.get("jsonrpc") != "2.0":
        return RpcError(code=INVALID_REQUEST, message='"jsonrpc" must be "2.0"', id=req_id)
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        return RpcError(code=INVALID_REQUEST, message='"method" must be a string', id=req_id)
    params = obj.get("params", [])
    if not isinstance(params, list | dict):
        return RpcError(
            code=INVALID_REQUEST, message='"params" must be an array or an object', id=req_id
        )
    return Request(id=req_id, method=method, params=params, is_notification=not has_id)


def result(req_id: RequestId, value: Any) -> str:
    return _dumps({"jsonrpc": "2.0", "id": req_id, "result": value})


def error(req_id: RequestId, code: int, message: str, data: Any = None) -> str:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return _dumps({"jsonrpc": "2.0", "id": req_id, "error": body})


def notification_prefix(method: str, subscription: str) -> str:
    """Everything of a subscription notification before its result object."""
    return (
        f'{{"jsonrpc":"2.0","method":{_dumps(method)},'
        f'"params":{{"subscription":{_dumps(subscription)},"result":'
    )


NOTIFICATION_SUFFIX = "}}"


def notification(method: str, subscription: str, result_json: str) -> str:
    return notification_prefix(method, subscription) + result_json + NOTIFICATION_SUFFIX


def parse_notification(text: str | bytes) -> tuple[str, Any] | None:
    """(subscription id, result object) of a subscription notification, else None."""
    try:
        obj = loads_bounded(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or "id" in obj:
        return None
    params = obj.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("subscription"), str):
        return None
    return params["subscription"], params.get("result")
