"""What the bus checker's seeds draw before anything runs: their variant and their faults."""

from __future__ import annotations

import random

import pytest

from tests.history.busnemesis import FAULTS, SENTINEL_FAULTS, STANDBY_FAULTS
from tests.history.busrun import variant_of
from tests.history.busschedule import (
    STANDBY_SHARE,
    Variant,
    draw_schedule,
    draw_variant,
    vary,
)
from tests.history.redisgroup import SENTINEL_SHARE
from tests.history.test_bus_history import SEEDS

SOAK = range(1000, 1200)


def _faults(seed: int, variant: Variant, steps: int = 8) -> list[str]:
    drawn = vary(draw_schedule(random.Random(seed), steps), variant, seed)
    return [s.fault for s in drawn if s.op == "fault"]


def test_a_seed_draws_the_same_schedule_with_at_least_two_faults() -> None:
    for seed in range(50):
        one = draw_schedule(random.Random(seed), 4)
        assert one == draw_schedule(random.Random(seed), 4)
        assert one[0].op == "calls" and sum(s.op == "fault" for s in one) >= 2


def test_the_variants_are_drawn_apart_each_at_its_share_and_always_the_same() -> None:
    variants = [draw_variant(s) for s in SOAK]
    assert variants == [draw_variant(s) for s in SOAK]
    standby = sum(v.standby for v in variants) / len(SOAK)
    sentinel = sum(v.sentinel for v in variants) / len(SOAK)
    assert abs(standby - STANDBY_SHARE) < 0.1 and abs(sentinel - SENTINEL_SHARE) < 0.08
    both = sum(v.standby and v.sentinel for v in variants) / len(SOAK)
    assert abs(both - standby * sentinel) < 0.06  # independent streams
    # make test's seeds: one with neither, one with standbys, one with both
    # (docs/history-checker.md says which)
    assert {draw_variant(s) for s in SEEDS} == {
        Variant(),
        Variant(standby=True),
        Variant(standby=True, sentinel=True),
    }


def test_make_tests_seeds_draw_every_fault_kind() -> None:
    drawn = {fault for seed in SEEDS for fault in _faults(seed, draw_variant(seed))}
    assert drawn == set(FAULTS + SENTINEL_FAULTS + STANDBY_FAULTS)


def test_a_seed_without_the_variant_keeps_the_schedule_it_always_drew() -> None:
    for seed in range(100):
        plain = draw_schedule(random.Random(seed), 8)
        assert vary(plain, Variant(), seed) == plain
        # with standbys, only faults change: the calls and waits are the same
        varied = vary(plain, Variant(standby=True, sentinel=True), seed)
        assert [s for s in varied if s.op != "fault"] == [s for s in plain if s.op != "fault"]


def test_a_sentinel_history_fails_over_and_never_restarts_or_wipes_a_server() -> None:
    for seed in range(200):
        faults = _faults(seed, Variant(sentinel=True))
        assert set(SENTINEL_FAULTS) & set(faults), seed
        assert not any(f.startswith(("restart_redis", "wipe_redis")) for f in faults), seed
        assert set(faults) <= set(FAULTS + SENTINEL_FAULTS), seed


def test_a_standby_history_kills_an_active_bus_and_a_standby() -> None:
    kinds: set[str] = set()
    for seed in range(200):
        faults = _faults(seed, Variant(standby=True))
        assert set(STANDBY_FAULTS) & set(faults), seed
        assert {"kill_sender", "kill_receiver"} & set(faults), seed
        kinds |= set(faults)
    assert set(STANDBY_FAULTS) <= kinds


def test_the_single_server_histories_draw_none_of_the_variants_faults() -> None:
    for seed in range(200):
        faults = _faults(seed, Variant())
        assert not set(faults) & set(SENTINEL_FAULTS + STANDBY_FAULTS), seed


def test_the_environment_forces_a_part_and_the_replay_line_carries_it() -> None:
    seed = next(s for s in SOAK if not draw_variant(s).sentinel)
    variant, forced = variant_of(seed, {"BUS_CHECKER_SENTINEL": "1", "BUS_CHECKER_STANDBY": ""})
    assert variant.sentinel and forced == {"BUS_CHECKER_SENTINEL": "1"}
    assert variant.standby == draw_variant(seed).standby
    assert variant_of(seed, {}) == (draw_variant(seed), {})
    with pytest.raises(ValueError, match="BUS_CHECKER_STANDBY='yes': 1 forces"):
        variant_of(seed, {"BUS_CHECKER_STANDBY": "yes"})
