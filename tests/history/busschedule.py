"""The generator of a bus history: a seeded schedule of steps, and the seed's variant.

Each step is one of: a burst of calls (how many, at what concurrency and pace,
and a seed for each call's ``exp``, ``try`` and handler hold: the burst runs
in the background while the next steps go on), a quiet while, or one fault of
the nemesis (:data:`tests.history.busnemesis.FAULTS`). Every history starts
with a burst and has at least two faults; the faults it draws are spread over
every kind.

A seed also draws its variant (:func:`draw_variant`), each from a stream of
draws of its own, so a seed that draws neither runs the schedule it always
drew: a standby bus for each twin (about one seed in two), and the twins'
Redis on Sentinel groups (about one in four). :func:`vary` then turns the
schedule's faults into the variant's, from a third stream: on Sentinel a
Redis restart or wipe of a twin becomes a failover of its group, with
standbys some kills of a twin's bus become kills of its standby; and adds one
of each where the schedule drew none.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from tests.history.busnemesis import FAULTS
from tests.history.redisgroup import SENTINEL_SHARE

#: the share of seeds whose twins each run a standby bus
STANDBY_SHARE = 0.5
#: of the kills of a twin's bus, the share that kill its standby (with standbys on)
KILL_STANDBY_SHARE = 0.5
SIDES = ("sender", "receiver")

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


def draw_schedule(rng: random.Random, steps: int) -> list[Step]:
    """``steps`` steps (and a first burst) drawn from ``rng``."""
    faults = FAULTS
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


@dataclass(frozen=True, slots=True)
class Variant:
    """What a seed runs beside its schedule (see the module doc)."""

    standby: bool = False
    sentinel: bool = False

    def text(self) -> str:
        return ", ".join(
            what for on, what in ((self.standby, "standbys"), (self.sentinel, "sentinel Redis"))
            if on
        )  # fmt: skip


def draw_variant(seed: int) -> Variant:
    """Seed ``seed``'s variant, each part from its own stream of draws."""
    return Variant(
        standby=random.Random(f"bus-standby/{seed}").random() < STANDBY_SHARE,
        sentinel=random.Random(f"bus-redis/{seed}").random() < SENTINEL_SHARE,
    )


def vary(steps: list[Step], variant: Variant, seed: int) -> list[Step]:
    """``steps`` with the faults of ``variant`` (see the module doc)."""
    rng = random.Random(f"bus-faults/{seed}")
    out = []
    for step in steps:
        action, _, side = step.fault.rpartition("_")
        if variant.sentinel and action in ("restart_redis", "wipe_redis"):
            step = dataclasses.replace(step, fault=f"failover_{side}")
        elif variant.standby and action == "kill" and rng.random() < KILL_STANDBY_SHARE:
            step = dataclasses.replace(step, fault=f"kill_standby_{side}")
        out.append(step)
    wanted = (["failover"] if variant.sentinel else []) + (
        ["kill", "kill_standby"] if variant.standby else []
    )
    for action in wanted:
        if not any(step.fault.rpartition("_")[0] == action for step in out):
            fault = f"{action}_{rng.choice(SIDES)}"
            out.insert(rng.randint(1, len(out)), Step("fault", fault=fault))
    return out


__all__ = [
    "KILL_STANDBY_SHARE",
    "OPS",
    "STANDBY_SHARE",
    "Step",
    "Variant",
    "calls_step",
    "draw_schedule",
    "draw_variant",
    "vary",
]
