"""The chain's history checker: seeded schedules with faults, every consumer against the model.

``make test`` runs :data:`SEEDS`; ``make soak`` runs ``CHECKER_SEEDS`` more
(from 1000 up); ``CHECKER_SEED=N`` runs seed N alone (what a failure prints).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.history.chainrun import replay_command, run_seed
from tests.history.conftest import SUMMARIES, TALLY

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

SEEDS = [1, 2, 3]


def _seeds() -> list[int]:
    one = os.environ.get("CHECKER_SEED")
    if one:
        return [int(one)]
    many = int(os.environ.get("CHECKER_SEEDS", "0") or 0)
    return list(range(1000, 1000 + many)) if many else SEEDS


@pytest.mark.parametrize("seed", _seeds())
async def test_chain_history(
    seed: int, tmp_path: Path, spark: Any, go_programs: dict[str, str], toxiproxy: Any
) -> None:
    steps = int(os.environ.get("CHECKER_STEPS", "12"))
    report = await run_seed(seed, tmp_path, spark, go_programs["consumer"], toxiproxy, steps)
    for fault in report.faults:
        TALLY[f"fault {fault}"] += 1
    for name in report.consumers:
        TALLY["consumer " + re.sub(r"-\d+$", "", name)] += 1
    for step in report.steps:
        if step.startswith("reorg"):
            TALLY[" ".join(step.split()[:2])] += 1
    SUMMARIES.append(report.summary())
    if report.violations:
        lines = [f"{name}: {'; '.join(bad)}" for name, bad in report.violations.items()]
        steps_text = "\n  ".join(report.steps)
        pytest.fail(
            f"{report.summary()}\nviolations:\n  " + "\n  ".join(lines)
            + f"\nschedule:\n  {steps_text}\nreplay: {replay_command(seed)}",
            pytrace=False,
        )  # fmt: skip
