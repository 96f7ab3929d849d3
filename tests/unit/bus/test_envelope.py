from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.bus import envelope
from pipeline.bus.answers import error_reply
from pipeline.bus.envelope import Envelope, decode, salvage
from pipeline.errors import EnvelopeError

SEED_FIELDS = ["ver", "uid", "cmd", "exp", "try", "dat", "src", "dst", "ret", "shm", "now", "err"]


def doc(**fields):
    base = {
        "ver": 1, "uid": "", "cmd": "wallet.stellar.balance.tft", "exp": 3600, "try": 4,
        "dat": base64.b64encode(b"GA7O").decode(), "src": 0, "dst": [1002],
        "ret": "5bf6bc-e87d799fbc73", "shm": "", "now": 1621944461, "err": "",
    }  # fmt: skip
    base.update(fields)
    return json.dumps(base).encode()


def test_seed_example_round_trips_with_seed_field_order():
    env = decode(doc())
    assert env.try_ == 4 and env.dst == [1002] and env.data == b"GA7O"
    out = json.loads(env.encode())
    assert list(out) == SEED_FIELDS
    assert out == json.loads(doc())


def test_only_ver_cmd_dst_ret_are_required():
    env = decode(b'{"ver":1,"cmd":"a.b","dst":[7],"ret":"q"}')
    assert (env.uid, env.exp, env.try_, env.dat, env.src, env.now, env.err) == (
        "",
        0,
        0,
        "",
        0,
        0,
        "",
    )
    assert env.data == b""


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"{nope", "not valid JSON"),
        (b"[1]", "not a JSON object"),
        (doc(ver=2), "ver must be 1"),
        (doc(ver=True), "ver must be 1"),
        (doc(cmd=""), "cmd must be a non-empty string"),
        (doc(cmd="has space"), "printable"),
        (doc(cmd="system.local"), "reserved"),
        (doc(dst=[]), "dst must be a non-empty list"),
        (doc(dst=1002), "dst must be a non-empty list"),
        (doc(dst=[True]), "dst must be a non-empty list"),
        (doc(dst=[-1]), "dst must be a non-empty list"),
        (doc(dst=list(range(65))), "more than 64"),
        (doc(ret=""), "ret must be"),
        (doc(ret=5), "ret must be"),
        (doc(exp=-1), "exp must be an integer >= 0"),
        (doc(exp=1.5), "exp must be an integer >= 0"),
        (doc(**{"try": -2}), "try must be an integer >= 0"),
        (doc(now="x"), "now must be"),
        (doc(dat="not base64!"), "dat must be valid base64"),
        (doc(uid=3), "uid must be a string"),
        (doc(src="1001"), "src must be a twin id"),
    ],
)
def test_invalid_envelopes_have_a_clear_err_text(raw, text):
    with pytest.raises(EnvelopeError) as info:
        decode(raw)
    assert info.value.public_message.startswith("invalid envelope: ")
    assert text in info.value.public_message


def test_size_limit():
    with pytest.raises(EnvelopeError, match="larger than 100"):
        decode(doc(dat=base64.b64encode(b"x" * 200).decode()), max_size=100)


def test_reply_accepts_a_literal_swap():
    env = decode(doc(src=[1002], dst=1001, ret="msgbus.system.reply"), reply=True)
    assert env.src == 1002 and env.dst == [1001]
    with pytest.raises(EnvelopeError, match="exactly one dst"):
        decode(doc(dst=[1, 2]), reply=True)
    with pytest.raises(EnvelopeError):
        decode(doc(dst=1001))  # requests stay strict


def test_salvage_reads_ret_from_broken_json():
    assert salvage(b'{"ver":1,"ret":"my-queue","cmd":"a.b","dst":[') == ("my-queue", "a.b")
    assert salvage(doc(ver=9)) == ("5bf6bc-e87d799fbc73", "wallet.stellar.balance.tft")
    assert salvage(b"garbage") == ("", "")
    assert salvage(b'{"ret": 5}') == ("", "")


def test_deadline_defaults_and_caps():
    env = decode(doc(now=1000, exp=0))
    assert envelope.deadline(env, received=5000, default_exp=300, max_exp=600) == 1300
    env = decode(doc(now=0, exp=10_000))
    assert envelope.deadline(env, received=5000, default_exp=300, max_exp=600) == 5600


def test_error_reply_is_about_the_destination():
    env = decode(doc()).copy(src=1001, uid="1002.9")
    fail = error_reply(env, "destination not found", about=1002, me=1001)
    assert (fail.src, fail.dst, fail.err, fail.ret, fail.uid) == (
        1002,
        [1001],
        "destination not found",
        env.ret,
        "1002.9",
    )


@given(
    cmd=st.from_regex(r"[a-z][a-z.]{0,20}", fullmatch=True).filter(
        lambda c: not c.startswith("system.")
    ),
    dst=st.lists(st.integers(0, 2**40), min_size=1, max_size=64),
    data=st.binary(max_size=64),
    exp=st.integers(0, 2**31),
    tries=st.integers(0, 100),
)
def test_round_trip(cmd, dst, data, exp, tries):
    env = Envelope(cmd=cmd, dst=dst, ret="r", exp=exp, try_=tries, dat=envelope.encode_data(data))
    back = decode(env.encode())
    assert back == env and back.data == data


def test_answer_parts_put_any_ret_back_in_place():
    from pipeline.bus.answers import answer_parts

    reply = Envelope(uid="1002.7", cmd="a.b", src=1002, dst=[1001], ret="msgbus.system.reply")
    head, tail = answer_parts(reply)
    for ret in ("r-1", 'q"uo\\te/slash', "ünï", '"ret":""'):
        joined = head + json.dumps(ret).encode() + tail
        assert decode(joined, reply=True) == reply.copy(ret=ret)


def test_salvage_gives_no_ret_the_request_was_refused_for():
    # An over-long ret is refused as invalid: the refusal must not be pushed to it either.
    long_ret = "q" * 300
    raw = doc(ret=long_ret, ver=9)
    with pytest.raises(EnvelopeError, match="at most 256"):
        decode(doc(ret=long_ret))
    assert salvage(raw)[0] == ""
    assert salvage(b'{"ret":"' + long_ret.encode() + b'","cmd":"a.b","dst":[')[0] == ""
    assert salvage(doc(ret="msgbus.system.local", ver=9))[0] == ""
