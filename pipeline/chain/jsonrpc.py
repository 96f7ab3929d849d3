"""JSON-RPC 2.0: the pure codec of the websocket endpoint (no I/O).

:func:`parse_message` turns one text frame into a :class:`Request`, a
:class:`Batch` or a :class:`RpcError` that carries the standard code; it never
raises (:func:`parse_request` is the same for a frame that must hold one
request object). It is bounded before it allocates: a text longer than
``max_chars`` or nested deeper than ``max_depth`` (found by a linear pre-scan
of the raw text, so Python's recursive JSON decoder is never reached with a
bomb) is refused as it is.

A batch (a JSON array of requests, JSON-RPC 2.0 section 6) is bounded like
its elements: the whole text within ``max_chars``, each element within
``max_depth`` (the array is one level more; an element nested deeper makes
the whole frame a parse error, since depth is checked before decoding), at
most ``max_batch`` elements (:data:`MAX_BATCH`). Each element is validated
exactly as :func:`parse_request` validates a lone request, so an invalid
element becomes its own :class:`RpcError` in its place. An empty array, or one
over ``max_batch``, is one ``-32600`` error object, not an array. The reply to
a batch is one array of the replies of its elements that are not
notifications, in request order (:func:`batch_reply`); none when all are
notifications. cardinal-rpc's websocket transport also answers a batch with
one array in request order, but sets no limit on its length, answers ``[]``
to an empty one, answers notifications too (``"id":null``), and refuses a
whole batch with one ``{"id":-1,"error":{"code":-1}}`` when any element does
not decode (e.g. ``[1]``, or ``params`` an object): Sluice follows JSON-RPC
2.0 there.

The encoders return JSON texts ready to send. Subscription notifications are
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
#: Most requests in one batch array: as many as one connection may have in flight
#: (``wsconn.MAX_IN_FLIGHT``), so an idle connection can always run a whole batch.
MAX_BATCH = 64

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """A batch array: its elements in order, each a request or the error that answers it."""

    items: tuple[Request | RpcError, ...]


_OPENS_ARRAY = re.compile(r"[ \t\n\r]*\[")


def _decode(text: str | bytes, max_chars: int, max_depth: int, *, batch: bool) -> Any:
    """The JSON value of a frame, or the :class:`RpcError` (``batch``: an array nests one more)."""
    if len(text) > max_chars:
        return RpcError(code=INVALID_REQUEST, message=f"request longer than {max_chars} characters")
    try:
        if isinstance(text, bytes):
            text = text.decode()
        # A batch's array is one level above its elements, each bounded like a lone request.
        is_array = batch and _OPENS_ARRAY.match(text) is not None
        if not nesting_within(text, max_depth + is_array):
            where = " in a batch element" if is_array else ""
            raise ValueError(f"nested deeper than {max_depth}{where}")
        return json.loads(text)
    except RecursionError:  # unreachable after the pre-scan; never let it escape
        return RpcError(code=PARSE_ERROR, message="parse error: nested too deep")
    except (ValueError, UnicodeDecodeError) as exc:
        return RpcError(code=PARSE_ERROR, message=f"parse error: {exc}")


def parse_message(
    text: str | bytes,
    *,
    max_chars: int = MAX_CHARS,
    max_depth: int = MAX_DEPTH,
    max_batch: int = MAX_BATCH,
) -> Request | Batch | RpcError:
    """One frame to a request, a batch of them, or the one error to answer with (never raises)."""
    obj = _decode(text, max_chars, max_depth, batch=True)
    if not isinstance(obj, list):
        return obj if isinstance(obj, RpcError) else request_of(obj)
    if not obj:
        return RpcError(code=INVALID_REQUEST, message="empty batch: send at least one request")
    if len(obj) > max_batch:
        return RpcError(
            code=INVALID_REQUEST, message=f"batch of {len(obj)} requests: at most {max_batch}"
        )
    return Batch(items=tuple(request_of(item) for item in obj))


def parse_request(
    text: str | bytes, *, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH
) -> Request | RpcError:
    """One frame holding one request object, or the error to answer with (never raises).

    A batch array is refused here (``-32600``); :func:`parse_message` takes both.
    """
    obj = _decode(text, max_chars, max_depth, batch=False)
    if isinstance(obj, list):
        return RpcError(
            code=INVALID_REQUEST, message="a batch array where one request was expected"
        )
    return obj if isinstance(obj, RpcError) else request_of(obj)


def request_of(obj: Any) -> Request | RpcError:
    """A decoded JSON value to a request, or the error to answer with (never raises)."""
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


def batch_reply(replies: list[str]) -> str | None:
    """The one text answering a batch: the replies of its elements in an array (None if none)."""
    return "[" + ",".join(replies) + "]" if replies else None


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
