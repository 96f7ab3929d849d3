"""The coalescer of a shared archive job's writes (:class:`pipeline.lake.write.arrowbatch.Coalescer`)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from pipeline.lake.write.arrowbatch import Coalescer
from tests.support.poll import until_sync


def test_requests_made_while_a_batch_runs_are_served_together_each_with_its_own_outcome() -> None:
    release = threading.Event()
    batches: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        batches.append(list(items))
        if len(batches) == 1:
            release.wait(30)  # the first batch runs until the others have queued
        return [item * 10 for item in items]

    shared: Coalescer[int, int] = Coalescer(run, limit=100)
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(shared.submit, 0)
        until_sync(lambda: batches, "the first batch to start")
        rest = [pool.submit(shared.submit, i) for i in range(1, 6)]
        until_sync(lambda: len(shared._queue) == 5, "the other requests to queue")
        release.set()
        outcomes = [first.result(30), *(f.result(30) for f in rest)]
    assert outcomes == [0, 10, 20, 30, 40, 50]
    assert batches[0] == [0] and sorted(batches[1]) == [1, 2, 3, 4, 5]
    assert (shared.batches, shared.items) == (2, 6)


def test_a_batch_takes_at_most_its_limit_and_a_failure_fails_every_request_of_it() -> None:
    from pipeline.lake.write.arrowbatch import _Request

    def run(items: list[int]) -> list[int]:
        if 13 in items:
            raise RuntimeError("batch failed")
        return items

    shared: Coalescer[int, int] = Coalescer(run, limit=4, weight=lambda item: 2)
    queued = [_Request[int, int](i) for i in (13, 14, 15)]
    shared._queue.extend(queued)  # queued by threads that wait for a leader

    # the caller leads: 13 and 14 (weight 4) in one batch, then 15 and its own 16
    assert shared.submit(16) == 16
    assert [type(r.error) for r in queued] == [RuntimeError, RuntimeError, type(None)]
    assert [r.done for r in queued] == [True, True, True] and queued[2].outcome == 15
    assert (shared.batches, shared.items) == (2, 4)
