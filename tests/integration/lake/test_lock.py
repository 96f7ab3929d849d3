"""The archive lock on a real Redis: per lake and stream, exclusive, waits bounded, never frees
another's lease."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pipeline import keys
from pipeline.errors import LockBusy, LockLost
from pipeline.lake.lock import StreamLock, lake_id
from pipeline.settings import LakeSettings

LAKE = LakeSettings.from_url("/lakes/one")


def test_second_holder_waits_then_gets_it(redis_url: str) -> None:
    first = StreamLock(redis_url, "s", lake=LAKE, owner="first", wait_s=5)
    first.__enter__()
    got: list[float] = []

    def second() -> None:
        with StreamLock(redis_url, "s", lake=LAKE, owner="second", wait_s=10) as lock:
            got.append(lock.waited_s)

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.7)
    assert not got  # still waiting
    first.release()
    thread.join(timeout=10)
    assert got and got[0] >= 0.5


def test_busy_lock_fails_naming_the_holder(redis_url: str) -> None:
    # (a wait that never ends would hit the test's timeout: no wall-clock bound here)
    with (
        StreamLock(redis_url, "s", lake=LAKE, owner="archive-run-1"),
        pytest.raises(LockBusy, match="archive-run-1"),
        StreamLock(redis_url, "s", lake=LAKE, wait_s=0.6),
    ):
        pass
    with StreamLock(redis_url, "s", lake=LAKE, wait_s=0):  # free again
        pass


def test_lease_is_renewed_and_a_lost_one_is_detected(redis_url: str, redis_client: Any) -> None:
    key = keys.archive_lock("s", lake_id(LAKE))
    with StreamLock(redis_url, "s", lake=LAKE, ttl_ms=1500) as lock:
        time.sleep(2.0)  # longer than the TTL: renewal keeps it
        assert redis_client.get(key) == lock.token.encode()
        lock.check()
        redis_client.set(key, b"someone-else")  # the lease was lost and taken
        deadline = time.monotonic() + 5
        while lock._lost is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(LockLost):
            lock.check()
    assert redis_client.get(key) == b"someone-else"  # release never frees another's lease


def _s3(uri: str, port: int) -> LakeSettings:
    return LakeSettings(uri=uri, s3_endpoint=f"http://127.0.0.1:{port}", s3_allow_http=True)


def test_two_lakes_archiving_one_stream_do_not_wait_for_each_other(redis_url: str) -> None:
    """Two deployments on one Redis archive the same stream into their own lakes (issue 33, 7)."""
    with StreamLock(redis_url, "s", lake=LAKE, owner="first"):
        others = (LakeSettings.from_url("/lakes/two"), _s3("s3://lake/one", 9000))
        for lake in (*others, _s3("s3://lake/one", 9001)):  # (one bucket on another server)
            with StreamLock(redis_url, "s", lake=lake, wait_s=0) as other:
                assert other.waited_s < 1
        # the same lake and stream is still exclusive, however its address is spelled
        with (
            pytest.raises(LockBusy, match="locked by first"),
            StreamLock(redis_url, "s", lake=LakeSettings.from_url("/lakes/one/"), wait_s=0),
        ):
            pass
        with (
            StreamLock(redis_url, "s", lake=_s3("s3://lake/one", 9000), owner="s3-job"),
            pytest.raises(LockBusy, match="locked by s3-job"),
            StreamLock(redis_url, "s", lake=_s3("s3://lake/one/", 9000), wait_s=0),
        ):
            pass
