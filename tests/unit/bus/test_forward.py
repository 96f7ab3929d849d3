from __future__ import annotations

import contextlib

from pipeline.bus.directory import FileDirectory
from pipeline.bus.forward import Forwarder, _Lane
from pipeline.bus.outbound import Kind, Outbound
from pipeline.bus.post import MAX_BATCH, _batch_results


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


def _item(n: int, body: bytes) -> Outbound:
    return Outbound(
        due=0.0, id=f"req:{n}", kind=Kind.REQUEST, to=1002, body=body,
        deadline=1e12, tries=4, uid=f"1002.{n}",
    )  # fmt: skip


def test_take_frames_a_batch_by_count_bytes_and_newlines():
    fwd = Forwarder(
        twin=1, directory=FileDirectory({}), signer=None, done=_done, max_batch_bytes=100
    )
    lane = _Lane()
    lane.queue.extend(_item(n, b"x" * 30) for n in range(5))
    lane.queue.insert(4, _item(9, b'{"a":\n1}'))
    # 30 + 31 + 31 = 92 bytes with the separators; a fourth would pass 100
    assert [i.id for i in fwd._take(lane, batch=True)] == ["req:0", "req:1", "req:2"]
    # an envelope holding a raw newline cannot be framed: it ends the batch, then goes alone
    assert [i.id for i in fwd._take(lane, batch=True)] == ["req:3"]
    assert [i.id for i in fwd._take(lane, batch=True)] == ["req:9"]
    # a peer that takes single envelopes gets one per POST
    assert [i.id for i in fwd._take(lane, batch=False)] == ["req:4"]
    assert not lane.queue
    big = _Lane()
    big.queue.extend(_item(n, b"{}") for n in range(MAX_BATCH + 5))
    fwd = Forwarder(twin=1, directory=FileDirectory({}), signer=None, done=_done)
    assert len(fwd._take(big, batch=True)) == MAX_BATCH


def test_batch_results_must_match_the_batch():
    assert _batch_results(b'{"results": [[200, ""], [409, "replayed request"]]}', 2) == [
        (200, ""),
        (409, "replayed request"),
    ]
    for raw in (
        b'{"results": [[200, ""]]}',  # one short
        b'{"results": [[200, ""], [true, ""]]}',  # not a status
        b'{"results": [[200, ""], ["200", ""]]}',
        b'{"results": [[200], [200, ""]]}',
        b'{"ok": true}',  # a single-envelope answer
        b'[[200, ""], [200, ""]]',
        b"not json",
        b"[" * 100_000,
    ):
        assert _batch_results(raw, 2) is None, raw


def test_no_peer_takes_batches_until_it_says_so():
    fwd = Forwarder(twin=1, directory=FileDirectory({}), signer=None, done=_done)
    assert not fwd.batches_to(1002)
    fwd._batching.add(1002)
    assert fwd.batches_to(1002)
    fwd._single_until[1002] = 1e12  # refused one: single envelopes for a while
    assert not fwd.batches_to(1002)
    fwd._single_until[1002] = 0.0  # the while is over: batches again
    assert fwd.batches_to(1002) and 1002 not in fwd._single_until


def test_a_lane_pumped_while_the_group_stops_keeps_its_items(recwarn):
    """A pump scheduled just before the forwarder stops finds its TaskGroup shutting
    down: the items stay queued for the next run, and no coroutine is left unawaited
    (before, ``create_task`` raised in the loop callback and the POST coroutine was
    reported as never awaited)."""
    import asyncio
    import gc

    fwd = Forwarder(twin=1, directory=FileDirectory({}), signer=None, done=_done)

    async def main() -> None:
        async def fail() -> None:
            raise ValueError("stop")

        async def pump_while_cancelled() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:  # the group is aborting: its tasks are cancelled
                fwd._enqueue(_item(1, b"{}"))
                fwd._pump((1002, Kind.REQUEST))
                raise

        with contextlib.suppress(ExceptionGroup):
            async with asyncio.TaskGroup() as group:
                fwd._group = group
                group.create_task(pump_while_cancelled())
                group.create_task(fail())

    asyncio.run(main())
    gc.collect()
    lane = fwd._lanes[(1002, Kind.REQUEST)]
    assert [i.id for i in lane.queue] == ["req:1"] and lane.inflight == 0
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)], recwarn.list


def test_an_item_that_expired_waiting_to_be_sent_again_keeps_what_its_attempts_said():
    from pipeline.bus.outbound import Outcome
    from pipeline.bus.post import expired

    def item(attempt: int, maybe: bool) -> Outbound:
        return Outbound(
            due=0.0, id="req:1002.5", kind=Kind.REQUEST, to=1002, body=b"{}", deadline=10.0,
            tries=4, uid="1002.5", attempt=attempt, last_error="no answer: refused",
            maybe_delivered=maybe,
        )  # fmt: skip

    items = [item(0, False), item(2, False), item(2, True)]
    assert expired(items, 9.0) == [None, None, None]
    assert expired(items, 10.0) == [
        (Outcome.EXPIRED, "request expired"),  # never sent: expired, nothing refused it
        (Outcome.UNREACHABLE, "no answer: refused"),  # never reached the peer
        (Outcome.UNKNOWN, "no answer: refused"),  # may have reached it
    ]


def test_a_request_whose_reply_came_is_settled_delivered_and_never_sent_again():
    """Forwarder.answered: a request waiting for a retry (or resent) when its reply is
    matched is delivered, before its deadline or after, and any attempt then out is not
    retried; a request it does not hold, or a reply, is left alone."""
    import asyncio

    from pipeline.bus.outbound import Outcome
    from pipeline.bus.post import expired

    fwd = Forwarder(twin=1, directory=FileDirectory({}), signer=None, done=_done)
    waiting, other = _item(1, b"{}"), _item(2, b"{}")
    waiting.attempt, waiting.deadline = 2, 10.0

    async def hand_over() -> None:
        await fwd.submit(waiting)
        await fwd.submit(other)

    asyncio.run(hand_over())
    fwd.answered(["1002.1", "1002.9"])
    assert waiting.answered and not other.answered
    assert expired([waiting, other], 5.0) == [(Outcome.DELIVERED, ""), None]
    assert expired([waiting], 11.0) == [(Outcome.DELIVERED, "")]
    # an attempt out when the reply came: settled, not retried
    assert fwd._settle(waiting, Outcome.UNKNOWN, "no answer") == (Outcome.DELIVERED, "")
    assert not fwd._delayed and fwd.retried == 0


def test_a_retry_whose_backlog_entry_is_gone_is_marked_answered():
    """post.mark_answered: a request sent before (a retry, a resend) whose reply another
    bus of the twin took is not sent again; a first attempt costs no Redis read; when
    Redis fails, the retry goes."""
    import asyncio

    from redis.exceptions import ConnectionError as RedisConnectionError

    from pipeline.bus.post import mark_answered

    asked: list[list[str]] = []

    async def gone(uids: list[str]) -> list[bool]:
        asked.append(uids)
        return [False] * len(uids)

    async def away(uids: list[str]) -> list[bool]:
        raise RedisConnectionError("Connection refused")

    first, retry, resent = _item(1, b"{}"), _item(2, b"{}"), _item(3, b"{}")
    retry.attempt, resent.resent = 1, True
    asyncio.run(mark_answered([first], gone))
    assert asked == [] and not first.answered
    kept = _item(4, b"{}")
    kept.attempt = 3
    asyncio.run(mark_answered([kept], away))
    assert not kept.answered
    asyncio.run(mark_answered([first, retry, resent], gone))
    assert asked == [["1002.2", "1002.3"]]
    assert (first.answered, retry.answered, resent.answered) == (False, True, True)
