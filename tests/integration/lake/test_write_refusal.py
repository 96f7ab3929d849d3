"""Lake jobs' Redis writes while Redis refuses them (``maxmemory``, ``noeviction``).

A refusal is reported like a lost connection (``RedisUnavailable``, which the
jobs' callers retry), not as an unknown Redis error that fails the job for good.
"""

from __future__ import annotations

import pytest

from pipeline.errors import RedisUnavailable
from pipeline.lake.lock import StreamLock
from pipeline.settings import LakeSettings
from tests.support.refusal import refusing

LAKE = LakeSettings.from_url("/lakes/refused")


def test_archive_lock_under_refused_writes_is_redis_unavailable(redis_url: str) -> None:
    with (
        refusing(redis_url),
        pytest.raises(RedisUnavailable, match="maxmemory"),
        StreamLock(redis_url, "refused", lake=LAKE),
    ):
        pass
    with StreamLock(redis_url, "refused", lake=LAKE, wait_s=1):
        pass  # and it works once memory is freed
