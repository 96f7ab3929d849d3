"""The chain's history checker: seeded schedules with faults, every consumer against the model.

``make test`` runs :data:`SEEDS`; ``make soak`` runs ``CHECKER_SEEDS`` more
(from 1000 up); ``CHECKER_SEED=N`` runs seed N alone (what a failure prints).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.history import harness
from tests.history.chainrun import replay_command, run_seed
from tests.history.conftest import record

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

#: 1071: a resume on a replaced branch the shared lake reader had not seen archived (it
#: failed every run before the fix; docs/history-checker.md)
SEEDS = [1, 2, 3, 1071]


@pytest.mark.parametrize("seed", harness.seeds(SEEDS))
async def test_chain_history(
    seed: int,
    tmp_path: Path,
    spark: Any,
    go_programs: dict[str, str],
    toxiproxy: Any,
    request: pytest.FixtureRequest,
) -> None:
    steps = harness.steps(12)
    report = await run_seed(seed, tmp_path, spark, go_programs["consumer"], toxiproxy, steps)
    draws: Counter[str] = Counter(f"fault {fault}" for fault in report.faults)
    draws["fault kill_serve to the second serve"] += report.switches
    draws.update("consumer " + re.sub(r"-\d+$", "", name) for name in report.consumers)
    draws.update(" ".join(s.split()[:2]) for s in report.steps if s.startswith("reorg"))
    record(request, [report.summary()], draws)
    for name in report.consumers:  # what each raw consumer was sent, for a failing seed
        if name.startswith("raw-"):
            lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
            assert lines and "subscribe" in json.loads(lines[0]), f"{name}: no log of its frames"
    if report.violations:
        text = harness.failure(
            report.summary(), report.violations, report.steps, replay_command(seed)
        )
        pytest.fail(text, pytrace=False)
