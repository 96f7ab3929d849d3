"""The generator: a seeded schedule of steps for one chain history.

Each step is one of: blocks written at a random pace; a reorg (its place:
inside Redis, inside the lake, or exactly at the seam, the lake's head being
the common ancestor; its depth and length are drawn when it runs, from 1 to
several times the reorg threshold, shorter, as long as or longer than what it
replaces); an archive, canonical and trim run; ``sluice produce`` going on
from the stream's head and killed -9; a consumer joining (its kind and
dialect drawn here, its height and hash when it joins); or one fault of the
nemesis (the kinds its Redis allows: :data:`tests.history.nemesis.FAULTS` on one
server, :data:`tests.history.nemesis.SENTINEL_FAULTS` on a Sentinel group). Every
history has at least two consumers and two faults, and one on a Sentinel group
at least one failover.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.history.consumers import KINDS
from tests.history.nemesis import FAULTS

PLACES = ("redis", "lake", "seam")
#: op -> relative weight
OPS = {"blocks": 4, "reorg": 3, "archive": 1, "produce": 1, "consumer": 2, "fault": 2}


@dataclass(frozen=True, slots=True)
class Step:
    op: str
    count: int = 0
    place: str = ""
    kind: str = ""
    dialect: str = ""
    fault: str = ""


def consumer_step(rng: random.Random) -> Step:
    kind = rng.choice(KINDS)
    dialect = "cardinal" if kind == "go" else rng.choice(("seed", "cardinal"))
    return Step("consumer", kind=kind, dialect=dialect)


def draw_schedule(rng: random.Random, steps: int, faults: tuple[str, ...] = FAULTS) -> list[Step]:
    """``steps`` steps drawn from ``rng`` (consumers first so most see the reorgs live),
    the faults from ``faults``."""
    out = [consumer_step(rng), consumer_step(rng)]
    ops, weights = zip(*OPS.items(), strict=True)
    for _ in range(steps):
        op = rng.choices(ops, weights)[0]
        if op == "blocks":
            out.append(Step("blocks", count=rng.randint(1, 30)))
        elif op == "reorg":
            out.append(Step("reorg", place=rng.choice(PLACES)))
        elif op == "consumer":
            out.append(consumer_step(rng))
        elif op == "fault":
            out.append(Step("fault", fault=rng.choice(faults)))
        else:
            out.append(Step(op))
    drawn = sum(step.op == "fault" for step in out)
    for _ in range(max(0, 2 - drawn)):
        out.insert(rng.randint(2, len(out)), Step("fault", fault=rng.choice(faults)))
    if "failover" in faults and not any(step.fault == "failover" for step in out):
        out.insert(rng.randint(2, len(out)), Step("fault", fault="failover"))
    return out


__all__ = ["OPS", "PLACES", "Step", "draw_schedule"]
