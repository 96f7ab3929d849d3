"""What the chain checker's seeds draw before anything runs: their Redis and their faults."""

from __future__ import annotations

import random

from tests.history.nemesis import FAULTS, SENTINEL_FAULTS
from tests.history.redisgroup import SENTINEL_SHARE, draws_sentinel
from tests.history.schedule import draw_schedule


def test_about_one_seed_in_four_runs_on_sentinel_and_always_the_same() -> None:
    soak = range(1000, 1200)
    share = sum(draws_sentinel(s) for s in soak) / len(soak)
    assert abs(share - SENTINEL_SHARE) < 0.08
    assert [draws_sentinel(s) for s in soak] == [draws_sentinel(s) for s in soak]
    # make test's seeds: one on Sentinel (docs/history-checker.md says which)
    assert [s for s in (1, 2, 3) if draws_sentinel(s)] == [3]


def test_a_sentinel_history_fails_over_and_never_touches_the_single_servers_faults() -> None:
    for seed in range(200):
        steps = draw_schedule(random.Random(seed), 12, SENTINEL_FAULTS)
        faults = [s.fault for s in steps if s.op == "fault"]
        assert "failover" in faults, seed
        assert not {"restart_redis", "redis_link"} & set(faults), seed


def test_a_single_server_history_draws_no_failover() -> None:
    for seed in range(200):
        steps = draw_schedule(random.Random(seed), 12, FAULTS)
        faults = [s.fault for s in steps if s.op == "fault"]
        assert len(faults) >= 2 and "failover" not in faults, seed
