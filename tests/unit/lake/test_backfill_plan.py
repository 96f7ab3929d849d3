"""The backfill's plan: the archive DAG's cron intervals, where it starts, what it leaves alone."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.lake import backfill
from pipeline.lake.backfill import (
    coverage_start,
    cron_intervals,
    floor_to_cron,
    parse_time,
    plan,
)

T0 = parse_time("2026-01-01T00:00:00Z", "t")
MIN = 60_000
FIVE = "*/5 * * * *"


def test_parse_time_forms_and_errors() -> None:
    assert parse_time("2026-01-01T00:00", "--since") == T0
    assert parse_time("2026-01-01T01:00:00+01:00", "--since") == T0
    assert parse_time("2026-01-01T00:00:00.250Z", "--since") == T0 + 250
    with pytest.raises(ConfigError, match="--until: not an ISO 8601 time: 'yesterday'"):
        parse_time("yesterday", "--until")


def test_intervals_follow_the_cron_and_stop_at_the_last_closed_one() -> None:
    assert floor_to_cron(FIVE, T0) == T0
    assert floor_to_cron(FIVE, T0 + 7 * MIN) == T0 + 5 * MIN
    got = cron_intervals(FIVE, T0 + 1, T0 + 14 * MIN)
    assert got == [(T0, T0 + 5 * MIN), (T0 + 5 * MIN, T0 + 10 * MIN)]
    hourly = cron_intervals("@hourly", T0 + 30 * MIN, T0 + 180 * MIN)
    assert hourly == [
        (T0, T0 + 60 * MIN),
        (T0 + 60 * MIN, T0 + 120 * MIN),
        (T0 + 120 * MIN, T0 + 180 * MIN),
    ]
    assert cron_intervals(FIVE, T0, T0 + 4 * MIN) == []


def test_interval_bound_and_bad_cron(monkeypatch: pytest.MonkeyPatch) -> None:
    # the bound lowered: the same check, without stepping the cron 100,000 times (10 s
    # under load)
    monkeypatch.setattr(backfill, "MAX_INTERVALS", 100)
    assert len(cron_intervals("* * * * *", T0, T0 + 100 * MIN)) == 100  # at the bound: fine
    with pytest.raises(ConfigError, match="over 100 archive intervals: narrow --since/--until"):
        cron_intervals("* * * * *", T0, T0 + 102 * MIN)
    with pytest.raises(ConfigError, match="archive_cron"):
        cron_intervals("every minute", T0, T0 + MIN)


def test_coverage_start() -> None:
    runs = [(T0, T0 + 10 * MIN), (T0 + 20 * MIN, T0 + 30 * MIN)]
    # the oldest entry in Redis is covered: start where that run ends (the safe trim's stop)
    assert coverage_start(runs, T0 + 3 * MIN)[0] == T0 + 10 * MIN
    # not covered: start at the oldest entry
    assert coverage_start(runs, T0 + 12 * MIN)[0] == T0 + 12 * MIN
    assert coverage_start(runs, None)[0] == T0 + 30 * MIN
    assert coverage_start([], None)[0] is None


def test_plan_skips_covered_intervals_and_clamps_to_now() -> None:
    logged = [(T0, T0 + 5 * MIN), (T0 + 10 * MIN, T0 + 15 * MIN)]
    got = plan(FIVE, "s", logged=logged, oldest_ms=None, now_ms=T0 + 23 * MIN, since_ms=T0)
    assert got.todo == ((T0 + 5 * MIN, T0 + 10 * MIN), (T0 + 15 * MIN, T0 + 20 * MIN))
    assert (got.covered, got.start_ms, got.end_ms) == (2, T0, T0 + 20 * MIN)
    # --until past Redis' clock stops at the last closed interval
    later = plan(
        FIVE, "s", logged=[], oldest_ms=T0 + 1, now_ms=T0 + 12 * MIN, until_ms=T0 + 60 * MIN
    )
    assert later.todo == ((T0, T0 + 5 * MIN), (T0 + 5 * MIN, T0 + 10 * MIN))
    # from coverage, everything covered: nothing to do
    done = plan(FIVE, "s", logged=[(T0, T0 + 10 * MIN)], oldest_ms=T0 + 1, now_ms=T0 + 12 * MIN)
    assert done.todo == () and done.start_ms == T0 + 10 * MIN
    # nothing anywhere
    empty = plan(FIVE, "s", logged=[], oldest_ms=None, now_ms=T0)
    assert empty.todo == () and empty.start_ms == empty.end_ms
