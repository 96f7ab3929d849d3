"""Fixtures of the history checkers: the Go programs, Toxiproxy, and the soak's tally.

A seed's test records its summary lines and draws with :func:`record`, on its
report (``user_properties``): the tally is made where reports arrive, in
pytest's own process, also when ``make test`` runs the suite in workers
(pytest-xdist), whose own terminal output nobody sees."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tests.integration.chain.conftest import go_programs  # noqa: F401 - a fixture
from tests.support.toxiproxy import toxiproxy, toxiproxy_server  # noqa: F401 - fixtures

#: what the seeds of this session drew: fault kinds, consumer kinds, reorg places
TALLY: Counter[str] = Counter()
#: one line per seed run
SUMMARIES: list[str] = []


#: the name of the user property a seed's test records
_PROPERTY = "history"


def record(request: pytest.FixtureRequest, lines: Sequence[str], draws: Mapping[str, int]) -> None:
    """Record a seed's summary lines and draws on its test's report."""
    request.node.user_properties.append((_PROPERTY, {"lines": list(lines), "draws": dict(draws)}))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == _PROPERTY:
            SUMMARIES.extend(value["lines"])
            TALLY.update(value["draws"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in SUMMARIES:
        terminalreporter.write_line(line)
    if TALLY:
        terminalreporter.write_line(
            "history checker drew: " + ", ".join(f"{k} {v}" for k, v in sorted(TALLY.items()))
        )
