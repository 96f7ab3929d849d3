"""Hostile input to the envelope decoder: fuzz plus fixed bombs (issue 11).

Whatever the bytes, :func:`envelope.decode` returns an :class:`Envelope` or
raises :class:`EnvelopeError`; :func:`envelope.salvage` and
:func:`envelope.loads` never raise anything else either.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bus import envelope
from pipeline.bus.envelope import MAX_DEPTH, MAX_INT, MAX_NAME, decode, salvage
from pipeline.errors import EnvelopeError

FIELDS = ["ver", "uid", "cmd", "exp", "try", "dat", "src", "dst", "ret", "shm", "now", "err"]


def doc(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "ver": 1, "uid": "", "cmd": "wallet.balance", "exp": 60, "try": 4,
        "dat": base64.b64encode(b"x").decode(), "src": 0, "dst": [1002],
        "ret": "5bf6bc-e87d799fbc73", "shm": "", "now": 1621944461, "err": "",
    }  # fmt: skip
    base.update(fields)
    return base


def raw(**fields: object) -> bytes:
    return json.dumps(doc(**fields)).encode()


def decodes_or_refuses(data: bytes | str, **kwargs: object) -> None:
    try:
        decode(data, **kwargs)  # type: ignore[arg-type]
    except EnvelopeError as exc:
        assert exc.public_message.startswith("invalid envelope: ")
    salvage(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))


# --- bombs ---------------------------------------------------------------------


@pytest.mark.parametrize("opener", [b"[", b"{", b'{"a":', b'{"ver":1,"x":['])
def test_nesting_100k_deep_is_refused_without_recursion(opener):
    bomb = opener * 100_000
    for reply in (False, True):
        with pytest.raises(EnvelopeError, match="nested deeper|larger than"):
            decode(bomb, reply=reply)
    assert salvage(bomb) == ("", "")
    with pytest.raises(EnvelopeError, match="nested deeper"):
        decode(bomb, max_size=len(bomb))


def test_one_kib_of_brackets_is_refused():  # the exact message
    with pytest.raises(EnvelopeError, match="nested deeper"):
        decode(b"[" * 1024)


def test_nesting_at_the_limit_is_parsed_and_one_more_is_refused():
    ok = b'{"ver":1,"x":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
    assert envelope.loads(ok, max_size=1 << 20)["ver"] == 1
    deep = b'{"ver":1,"x":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    with pytest.raises(EnvelopeError, match="nested deeper"):
        envelope.loads(deep, max_size=1 << 20)


def test_brackets_inside_strings_do_not_count_as_nesting():
    env = decode(raw(err="[" * 5000 + '\\"{' * 100, cmd="a.b"))
    assert env.err.startswith("[[[")


def test_size_just_over_the_limit():
    body = raw()
    assert decode(body, max_size=len(body)).cmd == "wallet.balance"
    with pytest.raises(EnvelopeError, match="larger than"):
        decode(body + b" ", max_size=len(body))


@pytest.mark.parametrize(
    ("name", "limit"), [("cmd", MAX_NAME), ("ret", MAX_NAME), ("uid", MAX_NAME)]
)
def test_names_just_over_their_limit(name, limit):
    value = "a" * limit
    assert getattr(decode(raw(**{name: value})), name) == value
    with pytest.raises(EnvelopeError, match=name):
        decode(raw(**{name: value + "a"}))


def test_destinations_just_over_the_limit():
    assert len(decode(raw(dst=list(range(envelope.MAX_DESTINATIONS)))).dst) == 64
    with pytest.raises(EnvelopeError, match="more than"):
        decode(raw(dst=list(range(envelope.MAX_DESTINATIONS + 1))))


@pytest.mark.parametrize("name", ["exp", "try", "now", "src"])
@pytest.mark.parametrize("value", [2**63, 2**256, -(2**63), 10**30])
def test_huge_numbers_are_refused(name, value):
    with pytest.raises(EnvelopeError, match=name):
        decode(raw(**{name: value}))


@pytest.mark.parametrize("value", [2**63, 2**256])
def test_huge_twin_ids_are_refused(value):
    with pytest.raises(EnvelopeError, match="dst"):
        decode(raw(dst=[value]))
    assert decode(raw(dst=[MAX_INT])).dst == [MAX_INT]


def test_number_with_thousands_of_digits_is_refused():
    with pytest.raises(EnvelopeError):
        decode(b'{"ver":1,"cmd":"a","dst":[1],"ret":"r","now":' + b"9" * 5000 + b"}")


WRONG = [None, True, 1.5, "1", [], {}, [1], {"a": 1}, -1, 2**64, "x" * 300]


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("value", WRONG, ids=repr)
def test_wrong_type_in_every_field(name, value):
    decodes_or_refuses(raw(**{name: value}))
    decodes_or_refuses(raw(**{name: value}), client=True)
    decodes_or_refuses(raw(**{name: value}), reply=True)


@pytest.mark.parametrize("value", ["msgbus.system.local", "msgbus.system.reply", "msgbus.x"])
def test_reserved_ret_is_refused(value):
    with pytest.raises(EnvelopeError, match="ret"):
        decode(raw(ret=value), client=True)
    assert decode(raw(ret=value)).ret == value  # the copy a handler gets


def test_salvage_keeps_neither_a_long_ret_nor_a_reserved_one():
    # Issue 21: a ret refused as invalid must not get the refusal pushed to it.
    long_ret = "r" * 1000
    assert salvage(raw(ret=long_ret))[0] == ""
    assert salvage(raw(ret="msgbus.system.local", ver=2)) == ("", "wallet.balance")
    broken = b'{"ret":"' + long_ret.encode() + b'","cmd":"a.b","dst":['
    assert salvage(broken) == ("", "a.b")
    assert salvage(b'{"ret":"msgbus.system.local","dst":[') == ("", "")


def test_constants_and_non_utf8():
    for bad in (b'{"ver":NaN}', b'{"ver":Infinity}', b"\xff\xfe\x00", b"", b"\x00" * 10):
        decodes_or_refuses(bad)


# --- fuzz ----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_fuzz_arbitrary_bytes(data):
    decodes_or_refuses(data)
    decodes_or_refuses(data, reply=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=12), st.booleans())
def test_fuzz_field_values(fields, reply):
    data = json.dumps({**doc(), **fields}).encode()
    decodes_or_refuses(data, reply=reply)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=64), st.integers(0, 300))
def test_fuzz_mutated_envelopes(chunk, at):
    base = raw()
    at = min(at, len(base))
    decodes_or_refuses(base[:at] + chunk + base[at:])
    decodes_or_refuses(base[:at] + chunk)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**70), st.integers(0, 2**70))
def test_deadline_is_bounded_whatever_now_and_exp(now, exp):
    env = envelope.Envelope(cmd="a", dst=[1], ret="r", now=min(now, MAX_INT), exp=min(exp, MAX_INT))
    received = 1_800_000_000.0
    expires = envelope.deadline(env, received=received, default_exp=300, max_exp=86400)
    assert expires <= received + envelope.MAX_SKEW_S + 86400


def test_now_in_milliseconds_counts_like_seconds():
    received = 1_800_000_010.0
    env = decode(raw(now=1_800_000_000_000, exp=60))
    assert envelope.deadline(env, received=received, default_exp=300, max_exp=600) == (
        1_800_000_060.0
    )


@pytest.mark.parametrize("now", [10**17, 2**62, 1_800_000_000 + 3600])
def test_now_in_the_far_future_counts_from_receipt(now):
    received = 1_800_000_000.0
    env = decode(raw(now=now, exp=60))
    assert envelope.deadline(env, received=received, default_exp=300, max_exp=600) == (
        received + 60
    )


# --- the fast codec paths give exactly what the general ones give --------------------

_text = st.text(max_size=40)  # any code point: quotes, controls, non-ASCII, surrogates
_int = st.integers(min_value=0, max_value=MAX_INT)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=st.fixed_dictionaries(
        {
            "uid": _text,
            "cmd": _text,
            "exp": _int,
            "try_": _int,
            "dat": _text,
            "src": _int,
            "dst": st.lists(_int, max_size=3),
            "ret": _text,
            "shm": _text,
            "now": _int,
            "err": _text,
        }  # fmt: skip
    ),
    changes=st.fixed_dictionaries(
        {},
        optional={
            "uid": _text,
            "src": _int,
            "dst": st.lists(_int, min_size=1, max_size=2),
            "try_": _int,
            "ret": _text,
        },  # fmt: skip
    ),
)
def test_encode_with_changed_fields_is_the_changed_copy_as_json_dumps_writes_it(fields, changes):
    env = envelope.Envelope(**fields)
    wanted = env.copy(**changes).to_dict()
    assert env.encode(**changes) == json.dumps(wanted, separators=(",", ":")).encode()
    assert json.loads(env.encode(**changes)) == wanted


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
), pad=st.sampled_from(["", " ", "\n", "\t ", " x", "]"]))  # fmt: skip
def test_loads_takes_and_refuses_what_json_loads_does(value, pad):
    text = json.dumps(value, ensure_ascii=False)
    for data in ((text + pad).encode(), (pad + text).encode(), text.encode("utf-16")):
        try:
            expected = json.loads(data)
        except ValueError:
            with pytest.raises(EnvelopeError, match="not valid JSON"):
                envelope.loads(data, max_size=1 << 20)
        else:
            assert envelope.loads(data, max_size=1 << 20) == expected
