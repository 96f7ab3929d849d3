"""What the history checkers share: seeds from the environment, the replay line, link faults.

- :func:`seeds`, :func:`steps`: which seeds a test runs. ``CHECKER_SEED=N`` runs
  seed N alone (what a failure prints), ``CHECKER_SEEDS=K`` runs 1000..1000+K-1
  (``make soak``; ``CHECKER_FIRST=F`` starts them at F instead, so two processes
  can share a soak), else the test's fixed seeds (``make test``). A checker may
  read its own variables first (``BUS_CHECKER_SEED`` and so on: ``prefix``).
- :func:`replay_command`: the one line that runs a seed again.
- :func:`link_fault`: one drawn Toxiproxy fault on a link (cut, latency, a
  half-open connection, a slow one, reset connections), held, then healed.
- :func:`failure`: the text a failing seed prints.
"""

from __future__ import annotations

import asyncio
import os
import random

from tests.support.toxiproxy import Proxy

#: the link faults the chain's nemesis draws from (its seeds replay with these, in this order)
LINK_FAULTS = ("cut", "latency", "half_open", "slow")
#: the first seed of ``CHECKER_SEEDS``
FIRST_SOAK_SEED = 1000


def _read(name: str, prefix: str) -> str:
    """``{prefix}{name}`` if set (non-empty), else ``name``."""
    if prefix and os.environ.get(prefix + name):
        return os.environ[prefix + name]
    return os.environ.get(name, "")


def seeds(fixed: list[int], prefix: str = "") -> list[int]:
    """The seeds to run: ``CHECKER_SEED``, else ``CHECKER_SEEDS`` from 1000 up, else ``fixed``."""
    one = _read("CHECKER_SEED", prefix)
    if one:
        return [int(one)]
    many = int(_read("CHECKER_SEEDS", prefix) or 0)
    first = int(_read("CHECKER_FIRST", prefix) or FIRST_SOAK_SEED)
    return list(range(first, first + many)) if many else list(fixed)


def steps(default: int, prefix: str = "") -> int:
    """``CHECKER_STEPS`` (or ``{prefix}CHECKER_STEPS``), else ``default``."""
    return int(_read("CHECKER_STEPS", prefix) or default)


def replay_command(test_file: str, seed: int, env: dict[str, str] | None = None) -> str:
    """The command that runs ``seed`` of ``test_file`` again (``env``: what else it needs)."""
    extra = "".join(f"{k}={v} " for k, v in (env or {}).items())
    return f"{extra}CHECKER_SEED={seed} .venv/bin/python -m pytest {test_file}"


async def link_fault(rng: random.Random, proxy: Proxy, kinds: tuple[str, ...] = LINK_FAULTS) -> str:
    """One fault drawn from ``kinds`` on ``proxy``, held 0.5 to 3 s, then healed; what it was."""
    kind = rng.choice(kinds)
    hold = rng.uniform(0.5, 3)
    if kind == "cut":
        await asyncio.to_thread(proxy.cut)
        await asyncio.sleep(hold)
        await asyncio.to_thread(proxy.restore)
    else:
        if kind == "latency":
            await asyncio.to_thread(proxy.latency, rng.randint(20, 400), rng.randint(0, 50))
        elif kind == "half_open":
            await asyncio.to_thread(proxy.half_open)
        elif kind == "reset_peer":
            await asyncio.to_thread(proxy.reset_peer, rng.randint(0, 200))
        else:
            await asyncio.to_thread(proxy.slow, rng.choice([1000, 10_000, 100_000]))
        await asyncio.sleep(hold)
        await asyncio.to_thread(proxy.clear)
    return f"{kind} {hold:.1f}s"


async def heal_link(proxy: Proxy) -> None:
    """Enable ``proxy`` again and remove its toxics."""
    await asyncio.to_thread(proxy.restore)
    await asyncio.to_thread(proxy.clear)


def failure(summary: str, violations: dict[str, list[str]], steps: list[str], replay: str) -> str:
    """What a failing seed prints: its summary, each violation, its schedule, its replay line."""
    lines = [f"{name}: {'; '.join(bad)}" for name, bad in violations.items()]
    steps_text = "\n  ".join(steps)
    return (
        f"{summary}\nviolations:\n  " + "\n  ".join(lines)
        + f"\nschedule:\n  {steps_text}\nreplay: {replay}"
    )  # fmt: skip


__all__ = [
    "FIRST_SOAK_SEED",
    "LINK_FAULTS",
    "failure",
    "heal_link",
    "link_fault",
    "replay_command",
    "seeds",
    "steps",
]
