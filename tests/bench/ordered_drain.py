"""The ordered chain's cost per block while it holds blocks (part of ``make bench B=resume``).

``ordered_accept_us_held_<n>``: microseconds to accept one block that links to
the head while ``n`` blocks wait above a gap (held); baseline: the same with
nothing held. Before the held blocks were indexed by parent, each new block
rescanned every held one (114 ms a block with 300 held, 1,245 ms with 1,000).
``ordered_fill_us_per_held_<n>``: the gap's block arrives and all ``n`` held
blocks join the chain; microseconds per joined block, against the baseline.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.chain.client.ordered import OrderedChain
from pipeline.chain.produce.generator import SyntheticChain

LINKED = 200  # blocks accepted one by one below the gap


def _accept_cost(blocks: list[Any], held: int) -> tuple[float, float]:
    """(us per linked block, us per held block joined when the gap fills)."""
    chain = OrderedChain(window=held + 2 * LINKED + 10, max_pending=held + 10)
    gap = LINKED + 1  # blocks[gap] comes last
    chain.accept(blocks[0])
    for block in blocks[gap + 1 : gap + 1 + held]:
        chain.accept(block)  # above the gap: held
    assert chain.pending == held
    start = time.perf_counter()
    for block in blocks[1:gap]:
        chain.accept(block)
    linked = (time.perf_counter() - start) / LINKED
    start = time.perf_counter()
    chain.accept(blocks[gap])
    fill = (time.perf_counter() - start) / max(held, 1)
    assert chain.head is not None and chain.head[0] == gap + held, chain.head
    return linked * 1e6, fill * 1e6


def run(report: Any) -> None:
    blocks = SyntheticChain(seed=5, prefixes=()).take(LINKED + 2 + 10_000)
    base_linked, base_fill = _accept_cost(blocks, 0)
    for held in (1_000, 10_000):
        linked, fill = _accept_cost(blocks, held)
        report.emit(f"ordered_accept_us_held_{held}", linked, base_linked, linked_blocks=LINKED)
        _, one = _accept_cost(blocks, 1)
        report.emit(f"ordered_fill_us_per_held_{held}", fill, one, held=held)
