"""The pure parts of a bus server's claims: the key of a redelivered request is Redis's
``sha1hex`` of it, and a request set aside after its handlers died is answered to its
caller with "handler failed" (one that does not decode is set aside unanswered)."""

from __future__ import annotations

import hashlib
import json

from pipeline import keys
from pipeline.bus.envelope import Envelope, decode
from pipeline.bus.handling import _queue_and_answer, digest


def test_digest_is_the_sha1_redis_computes() -> None:
    assert (
        digest(b"abc")
        == hashlib.sha1(b"abc").hexdigest()
        == ("a9993e364706816aba3e25717850c26c9cd0d89d")
    )


def test_a_request_set_aside_is_answered_handler_failed() -> None:
    request = Envelope(uid="1002.7", cmd="work", exp=60, src=1001, dst=[1002], ret="r-1", now=1)
    queue, raw = _queue_and_answer(request.encode(), 3)
    assert queue == keys.bus_command("work")
    answer = decode(raw, reply=True)
    assert answer.uid == "1002.7" and answer.src == 1002 and answer.dst == [1001]
    assert answer.err.startswith("handler failed: it died") and "3 time(s)" in answer.err
    assert json.loads(raw)["dat"] == ""


def test_a_request_that_does_not_decode_has_no_queue_and_no_answer() -> None:
    assert _queue_and_answer(b"not json", 3) == ("", b"")
