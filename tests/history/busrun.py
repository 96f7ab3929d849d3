"""One generated history of the bus, run against the real processes.

Two twins (:mod:`tests.history.busprocs`): the sender, whose callers push
requests to its Redis, and the receiver, whose handler (its own process)
logs every execution; each twin's ``sluice bus`` reaches the other only
through Toxiproxy. The seed's variant (:func:`tests.history.busschedule.draw_variant`)
adds a standby bus to each twin, or puts each twin's Redis on a Sentinel
group, or both. A seeded schedule (:mod:`tests.history.busschedule`) starts
bursts of calls that run in the background while the nemesis
(:mod:`tests.history.busnemesis`) strikes; at the end every fault is healed,
every call has had its ``exp`` plus slack to be answered, a while passes for a
second answer to show, and the checker (:mod:`tests.history.buschecker`)
judges every call's answers against the handler's log.

Timing is not replayed: a seed replays the same schedule, not the same
interleaving (as Jepsen's seeds do).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.history import buscallers, harness
from tests.history.buscallers import Call
from tests.history.buschecker import Execution, check
from tests.history.busnemesis import BusNemesis
from tests.history.busprocs import RECEIVER, BusProc, HandlerProc, Twin, make_twins
from tests.history.busschedule import Step, Variant, draw_schedule, draw_variant, vary
from tests.support.toxiproxy import Toxiproxy

#: After the last call's wait: how long a second answer has to show up.
SETTLE_S = 2.0
TEST_FILE = "tests/history/test_bus_history.py"


@dataclass
class Report:
    seed: int
    variant: Variant = field(default_factory=Variant)
    steps: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    violations: dict[str, list[str]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    #: of the outcomes that allow 0 or 1 executions: the calls that ran
    ran: Counter[str] = field(default_factory=Counter)
    allowed: list[str] = field(default_factory=list)
    calls: int = 0
    executions: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        outcomes = ", ".join(
            f"{k} {v}" + (f" ({self.ran[k]} ran)" if self.ran[k] else "")
            for k, v in sorted(self.outcomes.items())
        )
        allowed = f", {len(self.allowed)} allowed by a data loss" if self.allowed else ""
        variant = f" ({self.variant.text()})" if self.variant.text() else ""
        return (
            f"bus seed {self.seed}{variant}: {self.calls} calls ({outcomes}), {self.executions} "
            f"executions{allowed}, faults {self.faults}, {self.seconds:.0f}s"
        )


class BusHistory:
    """The processes and state of one run (see the module doc)."""

    def __init__(self, seed: int, workdir: Path, toxiproxy: Toxiproxy, variant: Variant) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.toxiproxy = toxiproxy
        self.variant = variant
        self.report = Report(seed, variant)
        self.calls: list[Call] = []
        self.bursts: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()

    def now(self) -> float:
        return self._loop.time()

    async def run(self, steps: int) -> Report:
        began = time.monotonic()
        standby = self.variant.standby
        sender, receiver, directory = await asyncio.to_thread(
            functools.partial(make_twins, self.workdir, self.toxiproxy, str(self.seed),
                              sentinel=self.variant.sentinel)
        )  # fmt: skip
        for twin in (sender, receiver):
            for name in ("p0", "p1") if standby else ("p0",):
                twin.procs.append(BusProc(twin, directory, self.workdir, name, health=standby))
        handler = HandlerProc(receiver.redis.url, self.workdir / "executions.jsonl",
                              self.workdir / "handler.log")  # fmt: skip
        client = buscallers.client(sender.redis.url)  # for the last look at every ret
        nemesis = BusNemesis(self.rng, sender, receiver)
        schedule = vary(draw_schedule(self.rng, steps), self.variant, self.seed)
        try:
            await asyncio.gather(*(t.procs[0].start() for t in (sender, receiver)),
                                 handler.start())  # fmt: skip
            # the standbys after the first: p0 is active
            await asyncio.gather(*(p.start() for t in (sender, receiver) for p in t.procs[1:]))
            for step in schedule:
                self.report.steps.append(await self.do(step, nemesis, sender))
            await nemesis.heal()
            await asyncio.gather(*self.bursts)
            await asyncio.sleep(SETTLE_S)
            await buscallers.extras(client, self.calls, self.now())
            self.verdict(handler.log, sender, receiver)
        finally:
            for task in self.bursts:
                task.cancel()
            await asyncio.gather(*self.bursts, return_exceptions=True)
            (self.workdir / "schedule.txt").write_text("\n".join(self.report.steps) + "\n")
            await _every(
                nemesis.heal, handler.stop,
                *(proc.stop for twin in (sender, receiver) for proc in twin.procs),
                client.aclose,
                *(functools.partial(asyncio.to_thread, twin.redis.stop)
                  for twin in (sender, receiver)),
                *(functools.partial(asyncio.to_thread, twin.link.delete)
                  for twin in (sender, receiver) if twin.link is not None),
            )  # fmt: skip
        self.report.seconds = time.monotonic() - began
        return self.report

    async def do(self, step: Step, nemesis: BusNemesis, sender: Twin) -> str:
        if step.op == "calls":
            calls = buscallers.draw_calls(random.Random(step.seed), len(self.calls) + 1,
                                          step.count, RECEIVER)  # fmt: skip
            self.calls += calls
            burst = buscallers.burst(sender.redis.url, calls, step.concurrency, step.pace_s,
                                     sender.losses, self.now)  # fmt: skip
            self.bursts.append(asyncio.create_task(burst, name=f"burst {calls[0].id}"))
            await asyncio.sleep(self.rng.uniform(0, 0.5))
            return f"{step.text()} ({calls[0].id}..{calls[-1].id})"
        if step.op == "wait":
            await asyncio.sleep(step.seconds)
            return step.text()
        self.report.faults.append(step.fault)
        return f"at {self.now():.1f}: " + await nemesis.strike(step.fault)

    def verdict(self, log: Path, sender: Twin, receiver: Twin) -> None:
        executions = []
        if log.exists():
            for line in log.read_text().splitlines():
                doc = json.loads(line)
                executions.append(Execution(doc["call"], doc["uid"], doc["t"]))
        verdict = check(self.calls, executions, sender_losses=sender.losses,
                        receiver_losses=receiver.losses,
                        outages=sender.outages + receiver.outages)  # fmt: skip
        self.report.violations = verdict.violations
        self.report.outcomes = verdict.outcomes
        self.report.ran = verdict.ran
        self.report.allowed = verdict.allowed
        self.report.calls = len(self.calls)
        self.report.executions = len(executions)
        with (self.workdir / "losses.jsonl").open("w") as out:  # to judge a run again by
            for twin in (sender, receiver):
                for loss in twin.losses:
                    out.write(json.dumps({"twin": twin.name, **dataclasses.asdict(loss)}) + "\n")
                for start, end in twin.outages:  # no master: nothing lost, nothing answered
                    out.write(json.dumps({"twin": twin.name, "outage": [start, end]}) + "\n")
        with (self.workdir / "calls.jsonl").open("w") as out:  # to read a failure by
            for call in self.calls:
                out.write(json.dumps({
                    "call": call.id, "exp": call.exp, "try": call.tries, "hold_ms": call.hold_ms,
                    "issued": round(call.issued, 3), "issued_wall": round(call.issued_wall, 3),
                    "sent": call.sent,
                    "answers": [[round(a.t, 3), a.err, a.late, a.made] for a in call.answers],
                }) + "\n")  # fmt: skip


async def _every(*steps: Callable[[], Awaitable[object]]) -> None:
    """Run every step of a cleanup even when one fails; their errors together at the end."""
    errors: list[Exception] = []
    for step in steps:
        try:
            await step()
        except Exception as exc:  # noqa: BLE001 - gathered, raised together at the end
            errors.append(exc)
    if errors:
        raise ExceptionGroup("cleaning up a bus history", errors)


def replay_command(seed: int, steps: int, default_steps: int, forced: dict[str, str]) -> str:
    """The line that runs ``seed`` again (``forced``: the variant's overrides in force)."""
    env = dict(forced)
    if steps != default_steps:
        env["CHECKER_STEPS"] = str(steps)
    return harness.replay_command(TEST_FILE, seed, env)


#: variable -> the part of the variant it forces ("1" on, "0" off; else the seed's draw)
OVERRIDES = {"BUS_CHECKER_STANDBY": "standby", "BUS_CHECKER_SENTINEL": "sentinel"}


def variant_of(seed: int, environ: dict[str, str]) -> tuple[Variant, dict[str, str]]:
    """Seed ``seed``'s variant with the overrides of ``environ``, and those overrides."""
    bad = [f"{k}={environ[k]!r}" for k in OVERRIDES if environ.get(k) not in (None, "", "0", "1")]
    if bad:
        raise ValueError(f"{', '.join(bad)}: 1 forces that part on, 0 off, unset draws it")
    forced = {k: environ[k] for k in OVERRIDES if environ.get(k) in ("0", "1")}
    parts = {OVERRIDES[k]: v == "1" for k, v in forced.items()}
    return dataclasses.replace(draw_variant(seed), **parts), forced


async def run_seed(seed: int, workdir: Path, toxiproxy: Toxiproxy, steps: int,
                   variant: Variant) -> Report:  # fmt: skip
    return await BusHistory(seed, workdir, toxiproxy, variant).run(steps)


__all__ = ["OVERRIDES", "BusHistory", "Report", "replay_command", "run_seed", "variant_of"]
