"""Live groups (pipeline/chain/history/live.py) send every subscriber exactly what its own Sender would.

Random chains (forks, heavier shorter branches, blocks whose parent was never
seen, blocks published twice, explicit and implied weights), subscribers that
join at random points with random earlier histories, filters that put them in
different groups, subscribers that leave: each one's notifications through the
hub with groups must equal those of a Sender of its own taking the same blocks,
and so must its Sender's state once the groups settled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.blockcodec import Block
from pipeline.chain.forkchoice import Sender
from pipeline.chain.history import live
from pipeline.chain.history.live import LiveGroups, LiveListener
from pipeline.chain.planning import Emit
from pipeline.chain.produce.producer import LiveBlock, WebsocketHub
from pipeline.chain.serve.patterns import compile_patterns
from pipeline.errors import BranchUnlinked


class Sink:
    def __init__(self) -> None:
        self.got: list[tuple[int, str, int]] = []

    def put_nowait(self, emits: list[Emit]) -> None:
        self.got.extend((e.num, e.hash, e.reorg) for e in emits)

    async def put(self, emits: list[Emit]) -> None:
        self.put_nowait(emits)

    def ready(self, num: int, hash: str) -> None:
        pass


def _hash(i: int) -> bytes:
    return i.to_bytes(32, "big")


@st.composite
def chains(draw: st.DrawFn) -> list[Block]:
    """Blocks in production order: mostly the tip's child, sometimes a fork lower down,
    an orphan (unknown parent), a block published again, or one reusing a known hash."""
    explicit = draw(st.booleans())
    blocks: list[Block] = []
    weights: dict[bytes, int] = {}
    tip: Block | None = None
    serial = 1
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["tip"] * 6 + ["fork", "orphan", "again", "collide"]))
        if kind == "again" and blocks:
            blocks.append(draw(st.sampled_from(blocks)))
            continue
        if kind == "fork" and blocks:
            parent: Block | None = draw(st.sampled_from(blocks))
        elif kind == "orphan" or tip is None:
            parent = None
        else:
            parent = tip
        if parent is None:
            num = draw(st.integers(0, (tip.num + 3) if tip else 3))
            parent_hash, parent_weight = _hash(10**9 + serial), num
        else:
            num, parent_hash = parent.num + 1, parent.hash
            parent_weight = weights[parent.hash]
        # (explicit weights may even fall: fork choice must not assume they grow)
        weight = max(0, parent_weight + draw(st.integers(-1, 3))) if explicit else None
        # a hash seen before on another block: garbage, but sent exactly as a Sender would
        reused = kind == "collide" and blocks
        block = Block(
            num=num,
            hash=draw(st.sampled_from(blocks)).hash if reused else _hash(serial),
            parent=parent_hash,
            updates={"a1": b"x", "b": b"y"},
            weight=weight,
        )
        serial += 1
        weights.setdefault(block.hash, weight if weight is not None else num + 1)
        blocks.append(block)
        if tip is None or weights[block.hash] > weights[tip.hash]:
            tip = block
    return blocks


@dataclass
class Plan:
    start: int
    before: int  # blocks [before, join) taken before going live, as a replay would
    join: int
    leave: int | None
    filtered: bool


def _state(sender: Sender) -> tuple[object, ...]:
    blocks = [(h, e.num) for h, e in sender._blocks.items()]
    return sender.head, sender.head_weight, sender.sent, dict(sender._hashes), blocks


async def _run(blocks: list[Block], plans: list[Plan]) -> None:
    items = [LiveBlock.from_block(b) for b in blocks]
    hub = WebsocketHub()
    groups = LiveGroups()
    hub.groups = groups
    filters = {False: None, True: compile_patterns(["a"])}
    own: list[Sender] = []
    refs: list[Sender] = []
    expected: list[list[tuple[int, str, int]]] = []
    sinks: list[Sink] = []
    listeners: list[LiveListener | None] = []
    for plan in plans:
        own.append(Sender(plan.start))
        refs.append(Sender(plan.start))
        expected.append([])
        sinks.append(Sink())
        listeners.append(None)
    for step in range(len(items) + 1):
        for i, plan in enumerate(plans):
            keep = filters[plan.filtered]
            if plan.join == step:
                try:
                    for item in items[plan.before : step]:  # the replay before going live
                        _take_both(own[i], refs[i], item.emit(keep))
                except BranchUnlinked:
                    continue  # (resumption plans again: not this test's part)
                listener = LiveListener(own[i], keep, sinks[i], groups=groups)
                hub.add(listener)
                assert listener.go_live(b"0-0")
                listeners[i] = listener
            listener = listeners[i]
            if plan.leave == step and listener is not None:
                listener.close()
                hub.discard(listener)
                listeners[i] = None
        if step == len(items):
            break
        item = items[step]
        hub.publish(item)
        _check_index(groups)
        for i, plan in enumerate(plans):
            listener = listeners[i]
            if listener is not None:
                keep = filters[plan.filtered]
                try:
                    sent = refs[i].take(item.emit(keep))
                except BranchUnlinked:
                    # the listener failed with the same, and takes nothing more
                    assert isinstance(listener.failed.exception(), BranchUnlinked)
                    hub.discard(listener)
                    listeners[i] = None
                    continue
                assert not listener.failed.done()
                expected[i].extend((e.num, e.hash, e.reorg) for e in sent)
    groups.settle()
    for i in range(len(plans)):
        assert sinks[i].got == expected[i], f"subscriber {i}: {plans[i]}"
        if listeners[i] is not None:
            assert _state(own[i]) == _state(refs[i]), f"subscriber {i}: {plans[i]}"


def _take_both(own: Sender, ref: Sender, emit: Emit) -> None:
    """Both Senders take ``emit``; either both raise BranchUnlinked or neither does."""
    try:
        own.take(emit)
    except BranchUnlinked:
        try:
            ref.take(emit)
        except BranchUnlinked:
            raise
        raise AssertionError("only one of two equal Senders raised") from None
    ref.take(emit)


def _check_index(groups: LiveGroups) -> None:
    """Every group is found by its state, and the index holds no group that is gone."""
    for group in groups._groups:
        found = groups._index.get((group.key, group.head, group.head_hash, group.head_weight))
        assert found is not None and (found.key, found.head, found.head_hash) == (
            group.key,
            group.head,
            group.head_hash,
        )
    listed = {id(g) for g in groups._groups}
    assert all(id(g) in listed for g in groups._index.values())


@settings(max_examples=300, deadline=None)
@given(data=st.data(), blocks=chains())
def test_groups_send_what_each_sender_would(data: st.DataObject, blocks: list[Block]) -> None:
    n = len(blocks)
    plans = []
    for _ in range(data.draw(st.integers(1, 6), label="subscribers")):
        join = data.draw(st.integers(0, n))
        before = data.draw(st.integers(0, join))
        leave = data.draw(st.none() | st.integers(join, n))
        start = data.draw(st.integers(0, 5))
        plans.append(Plan(start, before, join, leave, data.draw(st.booleans())))
    run_limit = data.draw(st.sampled_from([1, 2, 3, 64]), label="run_limit")
    known_limit = data.draw(st.sampled_from([0, 8, live.KNOWN_LIMIT]), label="known_limit")
    saved = live.RUN_LIMIT, live.KNOWN_LIMIT
    live.RUN_LIMIT, live.KNOWN_LIMIT = run_limit, known_limit
    try:
        asyncio.run(_run(blocks, plans))
    finally:
        live.RUN_LIMIT, live.KNOWN_LIMIT = saved


def _live_hub(
    blocks: int, sinks: list[Sink]
) -> tuple[WebsocketHub, LiveGroups, list[LiveBlock], list[LiveListener]]:
    """A hub with live groups, a chain of ``blocks`` live blocks, and one live listener per
    sink, each having taken the chain's first block (call inside a running event loop)."""
    hub = WebsocketHub()
    groups = LiveGroups()
    hub.groups = groups
    chain = [
        LiveBlock.from_block(Block(num=n, hash=_hash(n + 1), parent=_hash(n)))
        for n in range(blocks)
    ]
    listeners = []
    for sink in sinks:
        sender = Sender(0)
        sender.take(chain[0].emit(None))
        listener = LiveListener(sender, None, sink, groups=groups)
        hub.add(listener)
        assert listener.go_live(b"0-0")
        listeners.append(listener)
    return hub, groups, chain, listeners


def test_subscribers_in_one_state_share_one_group() -> None:
    """The common case: subscribers at the same head form one group, and stay in it while
    each block extends the head; a reorg splits nobody off for good."""

    async def run() -> None:
        sinks = [Sink(), Sink(), Sink()]
        hub, groups, chain, _ = _live_hub(5, sinks)
        assert len(groups) == 1
        for item in chain[1:]:
            hub.publish(item)
        assert len(groups) == 1
        fork = LiveBlock.from_block(Block(num=3, hash=_hash(99), parent=_hash(3), weight=10))
        hub.publish(fork)
        assert len(groups) == 1
        for sink in sinks:
            assert sink.got == [(n, _hash(n + 1).hex(), 0) for n in range(1, 5)] + [
                (3, _hash(99).hex(), 2)
            ]

    asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(2, 300),  # (below 2 the head forgets its parent: no fast path)
    side=st.lists(st.integers(0, 400), max_size=300),
    length=st.integers(1, 700),
    chunks=st.lists(st.integers(1, 300), min_size=1),
)
def test_advance_equals_takes(window: int, side: list[int], length: int, chunks: list[int]) -> None:
    """Sender.advance leaves the state a run of fast-path takes leaves: the window's pops,
    the kept blocks and their trims (from any number already kept, side blocks included)."""

    def emit(num: int, tag: str = "") -> Emit:
        return Emit(num, f"{tag}{num:063x}", f"{num - 1:063x}", [], 0, num + 1)

    one, other = Sender(1, window), Sender(1, window)
    for sender in (one, other):
        sender.take(emit(1))
        for n in side:  # side blocks held (not heavier), some above the head
            sender.hold(emit(n, "s"))
    run = [emit(n) for n in range(2, 2 + length)]
    for e in run:
        assert one.take(e) == [e]
    i = 0
    for size in chunks * (length // len(chunks) + 1):
        if i >= length:
            break
        other.advance(run[i : i + size])
        i += size
    assert _state(one) == _state(other)


def test_a_slow_member_fails_alone_and_leaves_its_group() -> None:
    """A member whose sink is full fails with SlowConsumer (its subscription is closed
    with 1008 by the caller); the other members keep getting every block."""
    from pipeline.errors import SlowConsumer

    class Full(Sink):
        def put_nowait(self, emits: list[Emit]) -> None:
            if len(self.got) >= 2:
                raise SlowConsumer("send buffer full")
            super().put_nowait(emits)

    async def run() -> None:
        sinks = [Sink(), Full(), Sink()]
        hub, groups, chain, listeners = _live_hub(6, sinks)
        for item in chain[1:]:
            hub.publish(item)
        every = [(n, _hash(n + 1).hex(), 0) for n in range(1, 6)]
        assert sinks[0].got == every and sinks[2].got == every
        assert sinks[1].got == every[:2]
        assert isinstance(listeners[1].failed.exception(), SlowConsumer)
        assert not listeners[0].failed.done() and not listeners[2].failed.done()
        (group,) = groups._groups
        assert set(group.members) == {listeners[0], listeners[2]}

    asyncio.run(run())
