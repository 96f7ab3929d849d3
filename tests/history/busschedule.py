"""The generator of a bus history: a seeded schedule of steps.

Each step is one of: a burst of calls (how many, at what concurrency and pace,
and a seed for each call's ``exp``, ``try`` and handler hold: the burst runs
in the background while the next steps go on), a quiet while, or one fault of
the nemesis (:data:`tests.history.busnemesis.FAULTS`, plus the standby faults
when they are on). Every history starts with a burst and has at least two
faults; the faults it draws are spread over every kind.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.history.busnemesis import FAULTS, STANDBY_FAULTS

#: op -> relative weight
OPS = {"calls": 3, "fault": 3, "wait": 1}


@dataclass(frozen=True, slots=True)
class Step:
    op: str
    count: int = 0
    concurrency: int = 0
    pace_s: float = 0.0
    seed: int = 0
    fault: str = ""
    seconds: float = 0.0

    def text(self) -> str:
        if self.op == "calls":
            return f"calls {self.count} at concurrency {self.concurrency}"
        if self.op == "wait":
            return f"wait {self.seconds:.1f}s"
        return f"fault {self.fault}"


def calls_step(rng: random.Random) -> Step:
    return Step("calls", count=rng.randint(5, 40), concurrency=rng.randint(1, 16),
                pace_s=rng.uniform(0, 0.1), seed=rng.randrange(1 << 30))  # fmt: skip


def draw_schedule(rng: random.Random, steps: int, *, standby: bool = False) -> list[Step]:
    """``steps`` steps (and a first burst) drawn from ``rng``."""
    faults = FAULTS + (STANDBY_FAULTS if standby else ())
    out = [calls_step(rng)]
    ops, weights = zip(*OPS.items(), strict=True)
    for _ in range(steps):
        op = rng.choices(ops, weights)[0]
        if op == "calls":
            out.append(calls_step(rng))
        elif op == "wait":
            out.append(Step("wait", seconds=rng.uniform(0.2, 2)))
        else:
            out.append(Step("fault", fault=rng.choice(faults)))
    for _ in range(max(0, 2 - sum(step.op == "fault" for step in out))):
        out.insert(rng.randint(1, len(out)), Step("fault", fault=rng.choice(faults)))
    return out


__all__ = ["OPS", "Step", "calls_step", "draw_schedule"]
