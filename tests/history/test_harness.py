"""Which seeds the checkers run, read from the environment (pure: no process started)."""

from __future__ import annotations

import pytest

from tests.history import harness


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CHECKER_SEED", "CHECKER_SEEDS", "CHECKER_FIRST", "CHECKER_STEPS"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv("BUS_" + name, raising=False)


def test_the_fixed_seeds_without_variables() -> None:
    assert harness.seeds([1, 2, 3]) == [1, 2, 3]


def test_one_seed_replays_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKER_SEED", "1009")
    monkeypatch.setenv("CHECKER_SEEDS", "200")
    assert harness.seeds([1, 2, 3]) == [1009]


def test_a_soak_starts_at_1000_or_where_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKER_SEEDS", "3")
    assert harness.seeds([1]) == [1000, 1001, 1002]
    monkeypatch.setenv("CHECKER_FIRST", "1100")
    assert harness.seeds([1]) == [1100, 1101, 1102]


def test_a_checkers_own_variables_come_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKER_SEEDS", "2")
    monkeypatch.setenv("BUS_CHECKER_SEEDS", "1")
    monkeypatch.setenv("BUS_CHECKER_STEPS", "5")
    assert harness.seeds([1], "BUS_") == [1000]
    assert harness.seeds([1]) == [1000, 1001]
    assert harness.steps(12, "BUS_") == 5 and harness.steps(12) == 12
