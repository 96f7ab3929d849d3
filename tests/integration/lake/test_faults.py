"""Clear errors for Redis down and an unwritable lake path (no Spark needed to reach them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.errors import LakePathError, RedisUnavailable
from pipeline.lake.archive import archive_interval
from pipeline.lake.replay import replay
from pipeline.lake.trim import safe_trim
from pipeline.lake.write.jobs import ensure_tables
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import settings_for


def _dead_url(redis_factory: Any) -> str:
    server = redis_factory()
    url: str = server.url
    server.stop()
    return url


def test_trim_and_replay_report_redis_down(redis_factory: Any, lake_uri: str) -> None:
    settings = settings_for(_dead_url(redis_factory), lake_uri)
    with pytest.raises(RedisUnavailable, match="unavailable while trimming"):
        safe_trim(settings, "c")
    with pytest.raises(RedisUnavailable, match="unavailable while replaying"):
        replay(settings, "c", 0, 5)


def test_unwritable_lake_path(tmp_path: Path, redis_client: Any, redis_url: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    lake_uri = str(blocker / "lake")
    with pytest.raises(LakePathError, match="cannot create the lake directory"):
        ensure_tables(LakeSettings.from_url(lake_uri))
    redis_client.xadd(keys.stream("c"), {b"block": b"x"}, id="5-0")
    # The archive job refuses before starting any Spark work (spark is never touched).
    with pytest.raises(LakePathError):
        archive_interval(None, settings_for(redis_url, lake_uri), "c", 0, 10)
    assert redis_client.xlen(keys.stream("c")) == 1
