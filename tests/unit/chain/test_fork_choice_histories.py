"""Generated histories of one subscriber's :class:`Sender` fed by canonical sources.

The neighbourhood of history checker seeds 1278 and 1591: a canonical source
(the lake at some version, the Redis tail's chain) read from a few heights
below what was sent, while the chain reorganises at any depth, past the
reading window included. A drawn history is a run of canonical chains, each
forking from the last at a random height (at most :data:`DEEPEST` below its
head, often deeper than the window) and read from ``back`` heights below the
subscriber's head, by pages (``extend`` for pages right above the head,
``accepted`` otherwise). :class:`BranchUnlinked` is the sender asking for a
new plan: as resumption does, the driver reads again from the fork point.

The subscriber applies what it was sent as a client does (a block with a
reorg depth replaces everything from its height up). After every page it holds
a contiguous, parent-linked chain; after each chain is read to its end it
holds exactly that chain. Sluice's own client (:class:`OrderedChain`, told of
each reorg as the seed dialect's ``reorgs`` notice tells it) is fed the same
blocks and must hold the same chain after every page.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.blockcodec import Block
from pipeline.chain.client.ordered import Added, OrderedChain
from pipeline.chain.forkchoice import Sender
from pipeline.chain.planning import Emit
from pipeline.errors import BranchUnlinked

#: How far below its head a new chain may fork (past the reading window of 0 to 12).
DEEPEST = 40


class Subscriber:
    """What a client holds: height -> (hash, parent), from the notifications in order."""

    def __init__(self) -> None:
        self.chain: dict[int, tuple[str, str]] = {}
        #: Sluice's client fed the same notifications, and the chain its updates build
        self.client = OrderedChain()
        self.client_chain: dict[int, str] = {}

    def apply(self, emits: list[Emit]) -> None:
        self._apply(emits)
        self._feed_client(emits)
        assert self.client_chain == {n: h for n, (h, _) in self.chain.items()}, (
            f"the client holds {sorted(self.client_chain.items())[-3:]}, "
            f"the subscriber was sent {sorted(self.chain.items())[-3:]}"
        )

    def _feed_client(self, emits: list[Emit]) -> None:
        for emit in emits:
            if emit.reorg:
                self.client.expect_rewind()  # the reorg notice before the block
            block = Block(
                num=emit.num, hash=bytes.fromhex(emit.hash), parent=bytes.fromhex(emit.parent),
                weight=emit.weight,
            )  # fmt: skip
            for update in self.client.accept(block):
                if isinstance(update, Added):
                    self.client_chain[update.block.num] = update.block.hash.hex()
                else:
                    assert self.client_chain.pop(update.num) == update.hash.hex()

    def _apply(self, emits: list[Emit]) -> None:
        for emit in emits:
            if emit.reorg:
                assert emit.num in self.chain, f"a reorg at {emit.num} above the head"
                for n in [n for n in self.chain if n >= emit.num]:
                    del self.chain[n]
            below = self.chain.get(emit.num - 1)
            assert emit.num not in self.chain, f"block {emit.num} sent twice"
            if self.chain:
                assert emit.num == max(self.chain) + 1, f"a gap below {emit.num}"
                assert below is not None and below[0] == emit.parent, (
                    f"broken link: {emit.num}:{emit.hash} on {emit.parent}, holds {below}"
                )
            self.chain[emit.num] = (emit.hash, emit.parent)

    def hashes(self) -> list[str]:
        return [self.chain[n][0] for n in sorted(self.chain)]


#: What each chain adds to its own blocks' weights: a later chain's blocks outweigh every
#: earlier chain's (a canonical source follows the heaviest chain).
CHAIN_WEIGHT = 1 << 20


def _chain(hashes: list[str], weights: dict[str, int]) -> list[Emit]:
    parents = ["00" * 32, *hashes[:-1]]
    return [
        Emit(n, h, p, [], 0, weights[h])
        for n, (h, p) in enumerate(zip(hashes, parents, strict=True))
    ]


def _read(sender: Sender, sub: Subscriber, chain: list[Emit], start: int, page: int) -> None:
    """Read ``chain`` from ``start`` by pages as resumption does; plan again on a lost link."""
    pos = start
    while pos < len(chain):
        emits = [Emit(e.num, e.hash, e.parent, [], 0, e.weight) for e in chain[pos : pos + page]]
        try:
            if sender.sent and emits[0].num == sender.head + 1:
                sender.extend(emits)
                sent = emits
            else:
                sent = sender.accepted(emits)
        except BranchUnlinked:
            # resumption plans again: the fork point is found (the lowest height at
            # which the sent chain and this one differ), and reading starts there
            held = sub.hashes()
            fork = next(
                (n for n, e in enumerate(chain) if n >= len(held) or held[n] != e.hash),
                len(chain),
            )
            assert fork < pos + page, "BranchUnlinked on a page that links"
            pos = fork
            continue
        sub.apply(sent)
        pos += len(emits)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_subscriber_of_canonical_sources_holds_the_last_chain(data: st.DataObject) -> None:
    label = iter(range(1, 1 << 30))
    length = data.draw(st.integers(1, 30), "genesis chain")
    hashes = [f"{next(label):064x}" for _ in range(length)]
    weights = {h: n + 1 for n, h in enumerate(hashes)}
    sender, sub = Sender(0), Subscriber()
    _read(sender, sub, _chain(hashes, weights), 0, data.draw(st.integers(1, 16), "page"))
    assert sub.hashes() == hashes
    for k in range(1, data.draw(st.integers(1, 8), "reorgs") + 1):
        fork = data.draw(st.integers(max(0, len(hashes) - DEEPEST), len(hashes)), "fork at")
        # at least one new block: a chain that only got shorter is a view lagging
        # behind (nothing to replace), not a reorg
        grow = data.draw(st.integers(1, 30), "new blocks")
        hashes = hashes[:fork] + [f"{next(label):064x}" for _ in range(grow)]
        weights.update({h: n + 1 + k * CHAIN_WEIGHT for n, h in enumerate(hashes) if n >= fork})
        back = data.draw(st.integers(0, 12), "read from below the head")
        start = max(0, min(sender.head + 1 - back, len(hashes) - 1))
        _read(sender, sub, _chain(hashes, weights), start, data.draw(st.integers(1, 16), "page"))
        assert sub.hashes() == hashes


def _heaviest(blocks: dict[str, Emit], order: list[str]) -> list[str]:
    """The model: the heaviest block (ties to the first produced) and its ancestors."""
    best = max(order, key=lambda h: blocks[h].weight)  # max() keeps the first of equals
    out = [best]
    while (parent := blocks[out[-1]].parent) in blocks:
        out.append(parent)
    return out[::-1]


def _replan(sender: Sender, sub: Subscriber, blocks: dict[str, Emit], order: list[str]) -> None:
    """Resumption after :class:`BranchUnlinked`: the canonical chain read again from the fork point."""
    chain = [blocks[h] for h in _heaviest(blocks, order)]
    _read(sender, sub, chain, 0, 1 << 30)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_live_subscriber_follows_the_heaviest_chain(data: st.DataObject) -> None:
    """Blocks in production order (``take``) after a catch-up, forks at any depth (past
    :attr:`Sender.RETAIN` too, on a long trunk), heavier or not, blocks offered twice,
    fills from the canonical chain a few heights down; a lost link plans again."""
    trunk = data.draw(st.sampled_from([5, 30, Sender.RETAIN + 20]), "trunk")
    blocks: dict[str, Emit] = {}
    order: list[str] = []

    def produce(parent: Emit | None, step: int) -> Emit:
        num = 0 if parent is None else parent.num + 1
        weight = 1 if parent is None else parent.weight + step
        emit = Emit(num, f"{len(order) + 1:064x}", "00" * 32 if parent is None else parent.hash,
                    [], 0, weight)  # fmt: skip
        blocks[emit.hash] = emit
        order.append(emit.hash)
        return emit

    tip = None
    for _ in range(trunk):
        tip = produce(tip, 1)
    sender, sub = Sender(0), Subscriber()
    _read(sender, sub, [blocks[h] for h in order], 0, data.draw(st.integers(1, 64), "page"))
    for _ in range(data.draw(st.integers(1, 60), "live blocks")):
        heads = _heaviest(blocks, order)
        step = data.draw(st.sampled_from(["block", "block", "block", "again", "fill"]), "step")
        if step == "again":  # a block the tail and the live feed both carry, offered twice
            seen = blocks[data.draw(st.sampled_from(order), "offered again")]
            try:
                sub.apply(sender.take(Emit(seen.num, seen.hash, seen.parent, [], 0, seen.weight)))
            except BranchUnlinked:
                _replan(sender, sub, blocks, order)
            continue
        if step == "fill":  # a replay's fill: the canonical chain from a few heights down
            back = data.draw(st.integers(0, 12), "fill from below the head")
            chain = [blocks[h] for h in heads]
            start = max(0, min(sender.head + 1 - back, len(chain) - 1))
            _read(sender, sub, chain, start, data.draw(st.integers(1, 16), "page"))
            continue
        if data.draw(st.booleans(), "fork"):
            depth = data.draw(st.integers(0, len(heads) - 1), "fork depth")
            parent = blocks[heads[len(heads) - 1 - depth]]
        else:
            parent = blocks[heads[-1]]
        emit = produce(parent, data.draw(st.integers(0, 3), "weight step"))
        try:
            sub.apply(sender.take(Emit(emit.num, emit.hash, emit.parent, [], 0, emit.weight)))
        except BranchUnlinked:
            _replan(sender, sub, blocks, order)
    assert sub.hashes() == _heaviest(blocks, order)
