"""When the demo gives up on a starting component: never while it makes progress, within a limit."""

from __future__ import annotations

import pytest

from pipeline.demo.patience import MIN_CPU_S, NOTE_EVERY_S, Patience


def _patience(**changes: float) -> Patience:
    return Patience(**{"started": 0.0, "base_s": 300.0, "limit_s": 1800.0, "stall_s": 120.0,
                       **changes})  # fmt: skip


def test_a_component_making_progress_is_waited_for_past_its_own_deadline() -> None:
    """Airflow at load 50: still starting at 300 s, its log growing (issue 33, 8)."""
    p = _patience()
    for now in range(0, 900, 5):
        p.sample(now, log_bytes=now * 10, cpu_s=0.0)  # a line every few seconds
        assert p.give_up(now) is None, now
    # then it stalls at 895 s: no output, no CPU; given up once the stall lasted 120 s
    for now in range(900, 1015, 5):
        p.sample(now, log_bytes=8950, cpu_s=0.0)
        assert p.give_up(now) is None, now
    p.sample(1015, log_bytes=8950, cpu_s=0.0)
    assert p.give_up(1015) == "within 300s, and no progress for 120s"


def test_cpu_counts_as_progress_only_past_a_floor() -> None:
    p = _patience()
    p.sample(0, 100, 1.0)
    p.sample(100, 100, 1.0 + MIN_CPU_S / 2)  # a process idling in a poll loop
    p.sample(200, 100, 1.0 + MIN_CPU_S * 0.9)  # still under the floor since the last progress
    assert p.last_progress == 0
    p.sample(250, 100, 1.0 + MIN_CPU_S * 1.5)  # at work (a migration, a JVM starting)
    assert p.last_progress == 250
    assert p.give_up(369) is None and p.give_up(370) is not None


def test_a_stalled_component_is_given_up_at_its_own_deadline_as_before() -> None:
    p = _patience()
    p.sample(0, 500, 2.0)
    assert p.give_up(299.9) is None
    assert p.give_up(300) == "within 300s, and no progress for 300s"


def test_the_start_limit_stops_any_wait_and_caps_the_own_deadline() -> None:
    p = _patience(limit_s=600.0)
    for now in range(0, 600, 5):
        p.sample(now, now, 0.0)
        assert p.give_up(now) is None
    assert p.give_up(600) == "within the start limit of 600s (--start-timeout)"
    short = _patience(limit_s=60.0)  # --start-timeout 60: Airflow's 300 s do not apply
    short.sample(0, 0, 0.0)
    assert short.give_up(59) is None and short.give_up(60) is not None


def test_it_says_what_the_component_did_every_minute_past_its_deadline() -> None:
    p = _patience()
    p.sample(0, 0, 0.0)
    assert p.note(299, 0, 0.0) is None
    first = p.note(300, 4096, 12.5)
    assert first == (
        "still starting after 300s, making progress (in the last 300s: 12.5 CPU-s, "
        "4.0 KiB of log); waiting while it does, for at most 1500s more"
    )
    assert p.note(300 + NOTE_EVERY_S - 1, 5000, 13.0) is None
    second = p.note(300 + NOTE_EVERY_S, 6144, 13.5)
    assert second is not None and "in the last 60s: 1.0 CPU-s, 2.0 KiB of log" in second


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        _patience(stall_s=0.0)
