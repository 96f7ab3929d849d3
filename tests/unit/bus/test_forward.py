from __future__ import annotations

from pipeline.bus.directory import FileDirectory
from pipeline.bus.forward import Forwarder, Kind, Outbound


async def _done(*_: object) -> None:
    return None


def test_backoff_doubles_and_is_capped():
    fwd = Forwarder(
        twin=1,
        directory=FileDirectory({}),
        signer=None,
        done=_done,
        retry_base_s=0.1,
        retry_max_s=1.0,
    )
    assert [fwd.backoff(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert fwd.backoff(10_000) == 1.0


def test_outbox_entry_round_trip():
    item = Outbound(
        due=0.0, id="req:1002.5", kind=Kind.REQUEST, to=1002, body=b'{"a":1}',
        deadline=123.5, tries=4, uid="1002.5",
    )  # fmt: skip
    back = Outbound.from_json(item.id, item.to_json())
    assert back.resent and not item.resent
    assert (back.kind, back.to, back.body, back.deadline, back.tries, back.uid) == (
        Kind.REQUEST,
        1002,
        b'{"a":1}',
        123.5,
        4,
        "1002.5",
    )
