"""Fixtures of the history checkers: the Go programs, Toxiproxy, and the soak's tally."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.integration.chain.conftest import go_programs  # noqa: F401 - a fixture
from tests.support.toxiproxy import toxiproxy, toxiproxy_server  # noqa: F401 - fixtures

#: what the seeds of this session drew: fault kinds, consumer kinds, reorg places
TALLY: Counter[str] = Counter()
#: one line per seed run
SUMMARIES: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in SUMMARIES:
        terminalreporter.write_line(line)
    if TALLY:
        terminalreporter.write_line(
            "history checker drew: " + ", ".join(f"{k} {v}" for k, v in sorted(TALLY.items()))
        )
