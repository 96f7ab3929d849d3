"""One fork choice everywhere: the tail index, the server's sender, the consumer and the lake.

Random block trees (weights grow along each branch, ties allowed between
branches), produced parents first: all four must pick the same head, the
heaviest block seen first, and the same chain down to the genesis.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.blockcodec import Block
from pipeline.chain.client.ordered import Added, OrderedChain
from pipeline.chain.forkchoice import Sender
from pipeline.chain.planning import Emit
from pipeline.chain.tailindex import TailIndex
from pipeline.lake.canonical import Node, plan_walk

GENESIS_PARENT = bytes(32)


@st.composite
def trees(draw: st.DrawFn) -> list[Block]:
    blocks = [Block(num=0, hash=(1).to_bytes(32, "big"), parent=GENESIS_PARENT, weight=1)]
    for i in range(draw(st.integers(1, 40))):
        parent = blocks[draw(st.integers(0, len(blocks) - 1))]
        step = draw(st.integers(1, 3))
        blocks.append(
            Block(
                num=parent.num + 1,
                hash=(i + 2).to_bytes(32, "big"),
                parent=parent.hash,
                weight=(parent.weight or 0) + step,
            )
        )
    return blocks


def _expected(blocks: list[Block]) -> list[bytes]:
    best = max(blocks, key=lambda b: b.weight or 0)  # max() keeps the first of equals
    by_hash = {b.hash: b for b in blocks}
    path = [best]
    while path[-1].parent in by_hash:
        path.append(by_hash[path[-1].parent])
    return [b.hash for b in reversed(path)]


@settings(max_examples=300, deadline=None)
@given(trees())
def test_every_fork_choice_agrees(blocks: list[Block]) -> None:
    expected = _expected(blocks)

    tail = TailIndex()
    for i, b in enumerate(blocks):
        tail.add(b.num, b.hash.hex(), b.parent.hex(), f"{i + 1}-0".encode(), b.weight)
    assert [bytes.fromhex(tail.chain[n][0]) for n in sorted(tail.chain)] == expected

    nodes = [
        Node(num=b.num, hash=b.hash.hex(), parent=b.parent.hex(), canonical=False,
             order=(i, 0), weight=b.weight)
        for i, b in enumerate(blocks)
    ]  # fmt: skip
    plan = plan_walk(nodes, 0)
    assert [bytes.fromhex(n.hash) for n in reversed(plan.mark)] == expected

    chain = OrderedChain()
    state: dict[int, bytes] = {}
    for b in blocks:
        for update in chain.accept(b):
            if isinstance(update, Added):
                state[update.block.num] = update.block.hash
            else:
                assert state.pop(update.num) == update.hash
    assert [state[n] for n in sorted(state)] == expected

    sender = Sender(0)
    sent: dict[int, str] = {}
    for b in blocks:
        for emit in sender.take(Emit(b.num, b.hash.hex(), b.parent.hex(), [], 0, b.weight or 0)):
            if emit.reorg:
                for n in [n for n in sent if n >= emit.num]:
                    del sent[n]
            assert emit.num == 0 or sent.get(emit.num - 1) == emit.parent  # parent-linked
            sent[emit.num] = emit.hash
    assert [bytes.fromhex(sent[n]) for n in sorted(sent)] == expected


@st.composite
def wild_trees(draw: st.DrawFn) -> list[Block]:
    """Block trees whose weights go anywhere (a child may be lighter than its parent)."""
    blocks = [Block(num=0, hash=(1).to_bytes(32, "big"), parent=GENESIS_PARENT, weight=1)]
    for i in range(draw(st.integers(1, 40))):
        parent = blocks[draw(st.integers(0, len(blocks) - 1))]
        blocks.append(
            Block(
                num=parent.num + 1,
                hash=(i + 2).to_bytes(32, "big"),
                parent=parent.hash,
                weight=draw(st.integers(0, 12)),
            )
        )
    return blocks


@settings(max_examples=300, deadline=None)
@given(st.one_of(trees(), wild_trees()), st.randoms(use_true_random=False), st.integers(0, 3))
def test_the_senders_fast_path_decides_as_its_general_path(
    blocks: list[Block], rng: Any, repeats: int
) -> None:
    """Production order with repeats and late side blocks: the same blocks sent, the same state."""
    order = list(blocks)
    rng.shuffle(order)
    order.sort(key=lambda b: b.num)  # parents before children, branches interleaved
    order += rng.sample(order, min(repeats, len(order)))
    fast, general = Sender(0), Sender(0)
    for block in order:
        emit = Emit(block.num, block.hash.hex(), block.parent.hex(), [], 0, block.weight or 0)
        assert fast.take(emit) == general._choose(emit)
        assert (fast.head, fast.head_weight, fast.sent) == (
            general.head,
            general.head_weight,
            general.sent,
        )
        assert fast._hashes == general._hashes and fast._blocks == general._blocks
