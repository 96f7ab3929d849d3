"""The envelope decoder's fast path (msgspec) against the general path (json + from_dict).

The fast path may only accept what the general path accepts, with the same
result; whatever it does not take goes the general way, so :func:`decode`
gives the same envelope or the same refusal for every input.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bus import envelope
from pipeline.bus.envelope import MAX_INT, Envelope, decode, from_dict, loads
from pipeline.errors import EnvelopeError

MODES = [{"reply": False, "client": False}, {"reply": True}, {"client": True}]


def general(raw: bytes, **kwargs: Any) -> Envelope | tuple[str, str]:
    try:
        return from_dict(loads(raw, max_size=1 << 20), **kwargs)
    except EnvelopeError as exc:
        return "refused", exc.public_message


def decoded(raw: bytes, **kwargs: Any) -> Envelope | tuple[str, str]:
    try:
        return decode(raw, **kwargs)
    except EnvelopeError as exc:
        return "refused", exc.public_message


def usual(**fields: Any) -> dict[str, Any]:
    doc = {
        "ver": 1, "uid": "1002.17", "cmd": "wallet.balance", "exp": 60, "try": 4,
        "dat": base64.b64encode(b"x" * 64).decode(), "src": 1001, "dst": [1002],
        "ret": "5bf6bc-e87d799fbc73", "shm": "", "now": 1621944461, "err": "",
    }  # fmt: skip
    doc.update(fields)
    return doc


@pytest.mark.parametrize("mode", MODES)
def test_the_usual_envelope_takes_the_fast_path_with_the_general_result(mode):
    raw = json.dumps(usual(), separators=(",", ":")).encode()
    fast = envelope._fast(raw, reply=mode.get("reply", False), client=mode.get("client", False))
    assert fast is not None
    assert fast == general(raw, **mode)


@pytest.mark.parametrize(
    "fields",
    [
        {"ver": True}, {"ver": 2}, {"exp": -1}, {"exp": 1.0}, {"now": MAX_INT + 1},
        {"dst": []}, {"dst": [1, 2]}, {"dst": 1002}, {"src": [1001]}, {"dst": [False]},
        {"cmd": "system.x"}, {"cmd": "a b"}, {"cmd": ""}, {"cmd": "c" * 257},
        {"ret": "msgbus.system.local"}, {"ret": ""}, {"ret": None}, {"uid": "u" * 257},
        {"dat": "not base64!"}, {"shm": 3}, {"err": None}, {"uid": "\ud800"}, {"x": [[[[[]]]]]},
    ],
)  # fmt: skip
def test_what_the_fast_path_does_not_take_is_judged_as_before(fields):
    raw = json.dumps(usual(**fields)).encode()
    for mode in MODES:
        assert decoded(raw, **mode) == general(raw, **mode)


values = st.one_of(
    st.integers(min_value=-5, max_value=MAX_INT + 5),
    st.integers(min_value=0, max_value=2**70),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["", "a.b", "system.x", "msgbus.r", "eA==", "eA", "r r"]),
    st.lists(st.integers(min_value=-1, max_value=MAX_INT + 1), max_size=3),
    st.lists(st.booleans(), max_size=2),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.dictionaries(st.sampled_from(list(usual()) + ["extra"]), values, max_size=4),
    dropped=st.sets(st.sampled_from(list(usual())), max_size=3),
    ascii_only=st.booleans(),
    cut=st.one_of(st.none(), st.integers(min_value=0, max_value=200)),
)
def test_decode_equals_the_general_path_whatever_the_fields(changes, dropped, ascii_only, cut):
    doc = usual(**changes)
    for name in dropped:
        doc.pop(name, None)
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if cut is not None:
        raw = raw[:cut]
    for mode in MODES:
        assert decoded(raw, **mode) == general(raw, **mode)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    at=st.integers(min_value=0, max_value=400),
    chunk=st.binary(min_size=1, max_size=16),
    skip=st.integers(min_value=0, max_value=3),
)
def test_decode_equals_the_general_path_whatever_bytes_are_spliced_in(at, chunk, skip):
    """Random bytes anywhere (in a key it skips, too): the fast path adds no acceptance."""
    base = json.dumps(usual(), separators=(",", ":")).encode()
    at %= len(base)
    raw = base[:at] + chunk + base[at + skip :]
    for mode in MODES:
        assert decoded(raw, **mode) == general(raw, **mode)


@pytest.mark.parametrize("key", [b"\xff>r", b"\x01x", b"m\xe2\x84uid", b"\x7f"])
def test_a_key_the_fast_path_skips_is_still_checked(key):
    raw = json.dumps(usual(), separators=(",", ":")).encode()[:-1] + b',"' + key + b'":""}'
    for mode in MODES:
        assert decoded(raw, **mode) == general(raw, **mode)
