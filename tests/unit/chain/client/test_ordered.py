from __future__ import annotations

import random

import pytest

from pipeline.blockcodec import BatchHeader, Block, SubBatch
from pipeline.chain.client.ordered import Added, BlockAssembler, OrderedChain, Removed
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.errors import ChainGap, OrderingError


def apply(chain: OrderedChain, blocks) -> list:
    out = []
    for b in blocks:
        out.extend(chain.accept(b))
    return out


def final_chain(updates) -> dict[int, bytes]:
    state: dict[int, bytes] = {}
    for u in updates:
        if isinstance(u, Added):
            state[u.block.num] = u.block.hash
        else:
            assert state.pop(u.num) == u.hash
    return state


def test_in_order_and_duplicates() -> None:
    blocks = SyntheticChain(seed=1).take(10)
    chain = OrderedChain()
    ups = apply(chain, blocks + blocks[3:6])
    assert [u.block.num for u in ups] == list(range(10))
    assert chain.head == (9, blocks[9].hash)


def test_shuffled_with_duplicates_yields_canonical_order() -> None:
    gen = SyntheticChain(seed=2)
    blocks = gen.take(200)
    noisy = blocks[1:] + blocks[50:80]
    random.Random(5).shuffle(noisy)
    chain = OrderedChain()
    ups = apply(chain, [blocks[0], *noisy])
    assert [u.block.num for u in ups] == list(range(200))


def test_reorg_removes_then_adds() -> None:
    gen = SyntheticChain(seed=3, reorg_every=10, reorg_depth=3)
    emitted = gen.take(100)
    chain = OrderedChain()
    ups = apply(chain, emitted)
    assert any(isinstance(u, Removed) for u in ups)
    assert final_chain(ups) == {b.num: b.hash for b in gen.canonical}
    # removals come from the head down
    removed = [u.num for u in ups if isinstance(u, Removed)]
    assert removed


def test_seeded_head_and_server_rewind() -> None:
    gen = SyntheticChain(seed=4)
    blocks = gen.take(30)
    # the client believes it has block 20 with some other hash; the server rewinds to 12
    chain = OrderedChain(head=(20, b"\x01" * 32))
    chain.expect_rewind()
    ups = apply(chain, blocks[12:30])
    assert ups[0] == Removed(num=20, hash=b"\x01" * 32)
    assert [u.block.num for u in ups[1:]] == list(range(12, 30))


def test_stale_old_duplicate_is_dropped_without_rewind() -> None:
    blocks = SyntheticChain(seed=5).take(20)
    chain = OrderedChain(window=5)
    apply(chain, blocks)
    assert chain.accept(blocks[2]) == []
    assert chain.head == (19, blocks[19].hash)


def test_pending_is_bounded() -> None:
    blocks = SyntheticChain(seed=6).take(10)
    chain = OrderedChain(max_pending=3)
    chain.accept(blocks[0])
    for b in blocks[2:5]:
        assert chain.accept(b) == []
    with pytest.raises(OrderingError):
        chain.accept(blocks[6])


def test_assembler_joins_subbatches_in_any_order() -> None:
    gen = SyntheticChain(seed=7, prefixes=("a/", "b/"))
    block = gen.take(1)[0]
    header = BatchHeader(
        num=block.num, hash=block.hash, parent=block.parent, updates=block.updates,
        deletes=block.deletes, batches=block.batches, weight=block.weight,
    )  # fmt: skip
    asm = BlockAssembler()
    assert asm.subbatch(block.hash, block.subbatches[1]) is None  # early sub-batch
    assert asm.batch(header) is None
    assert asm.subbatch(block.hash, block.subbatches[0]) == block


def test_assembler_is_bounded() -> None:
    asm = BlockAssembler(max_partial=2)
    for i in range(2):
        h = bytes([i]) * 32
        asm.batch(BatchHeader(num=i, hash=h, parent=h, updates={}, deletes=(), batches={"p": h}))
    with pytest.raises(OrderingError):
        asm.batch(
            BatchHeader(num=9, hash=b"\x09" * 32, parent=b"\x09" * 32, updates={}, deletes=(),
                        batches={"p": b"\x01" * 32})
        )  # fmt: skip
    assert asm.subbatch(b"\x05" * 32, SubBatch(id=b"x")) is None


def test_reorg_to_a_shorter_heavier_chain() -> None:
    gen = SyntheticChain(seed=8)
    main = gen.take(12)
    branch = gen.reorg(5, 2)  # heights 7, 8 replace 7..11
    chain = OrderedChain()
    ups = apply(chain, main + branch)
    assert final_chain(ups) == {b.num: b.hash for b in gen.canonical}
    assert [u.num for u in ups if isinstance(u, Removed)] == [11, 10, 9, 8, 7]
    assert chain.head == (8, branch[-1].hash) and chain.head_weight == branch[-1].weight


def test_lighter_branch_is_held_until_it_becomes_heavier() -> None:
    gen = SyntheticChain(seed=9)
    main = gen.take(10)
    base = main[5]
    side1 = Block(num=6, hash=b"\x61" * 32, parent=base.hash, weight=base.weight + 1)  # type: ignore[operator]
    side2 = Block(num=7, hash=b"\x62" * 32, parent=side1.hash, weight=main[-1].weight)  # a tie
    side3 = Block(num=8, hash=b"\x63" * 32, parent=side2.hash, weight=main[-1].weight + 1)  # type: ignore[operator]
    chain = OrderedChain()
    apply(chain, main)
    assert chain.accept(side1) == [] and chain.accept(side2) == []  # lighter, then a tie
    assert chain.head == (9, main[-1].hash) and chain.pending == 2
    ups = chain.accept(side3)
    assert [u.num for u in ups if isinstance(u, Removed)] == [9, 8, 7, 6]
    assert [u.block.hash for u in ups if isinstance(u, Added)] == [
        side1.hash, side2.hash, side3.hash,
    ]  # fmt: skip
    assert chain.pending == 4  # the replaced blocks, held in case their branch wins again


def test_child_not_heavier_than_its_parent_does_not_extend() -> None:
    gen = SyntheticChain(seed=10)
    main = gen.take(3)
    flat = Block(num=3, hash=b"\x33" * 32, parent=main[-1].hash, weight=main[-1].weight)
    chain = OrderedChain()
    apply(chain, main)
    assert chain.accept(flat) == [] and chain.head == (2, main[-1].hash)


def test_a_gap_past_the_head_raises_at_once_with_gaps_on() -> None:
    blocks = SyntheticChain(seed=11).take(20)
    chain = OrderedChain(gaps=True)
    apply(chain, blocks[:10])
    with pytest.raises(ChainGap):
        chain.accept(blocks[15])  # 10..14 skipped: nothing it could wait for
    assert chain.head == (9, blocks[9].hash) and chain.pending == 0
    assert [u.block.num for u in apply(chain, blocks[10:])] == list(range(10, 20))


def test_a_gap_is_held_with_gaps_off() -> None:
    blocks = SyntheticChain(seed=12).take(20)
    chain = OrderedChain()
    apply(chain, blocks[:10])
    assert chain.accept(blocks[15]) == [] and chain.pending == 1
    ups = apply(chain, blocks[10:15])
    assert [u.block.num for u in ups] == list(range(10, 16))


def test_a_held_child_heavier_than_the_head_wins_when_its_lighter_parent_comes() -> None:
    gen = SyntheticChain(seed=13)
    main = gen.take(10)
    base = main[7]
    side1 = Block(num=8, hash=b"\x71" * 32, parent=base.hash, weight=base.weight + 1)  # type: ignore[operator]
    side2 = Block(num=9, hash=b"\x72" * 32, parent=side1.hash, weight=main[-1].weight + 5)  # type: ignore[operator]
    chain = OrderedChain()
    apply(chain, main)
    assert chain.accept(side2) == []  # its parent has not come: held
    ups = chain.accept(side1)  # lighter than the head alone, but its held child is heavier
    assert [u.num for u in ups if isinstance(u, Removed)] == [9, 8]
    assert [u.block.hash for u in ups if isinstance(u, Added)] == [side1.hash, side2.hash]


def test_held_blocks_are_woken_by_their_parent_only() -> None:
    """Blocks in reverse order: each arrival tries only its own held child (linear, not n^2)."""
    blocks = SyntheticChain(seed=14).take(3000)
    chain = OrderedChain(max_pending=5000)
    chain.accept(blocks[0])
    calls = 0
    place = chain._place

    def counting(block: Block, out: list) -> bool:
        nonlocal calls
        calls += 1
        return place(block, out)

    chain._place = counting  # type: ignore[method-assign]
    ups = apply(chain, blocks[:0:-1])
    assert [u.block.num for u in ups] == list(range(1, 3000))
    assert chain.head == (2999, blocks[-1].hash)
    # one try on arrival, one when its parent is held, one when its parent lands
    assert calls <= 3 * len(blocks)


@pytest.mark.parametrize("seed", range(6))
def test_the_remembered_low_is_always_the_lowest_height(seed: int) -> None:
    """``_low`` moves a floor up instead of taking ``min`` of the window on every block:
    through reorgs, rewinds, producer-named ancestors, a small window and shuffled
    arrivals it must equal the lowest height the chain remembers."""
    rng = random.Random(seed)
    gen = SyntheticChain(seed=40 + seed, reorg_every=7, reorg_depth=4)
    blocks = gen.take(400)
    chain = OrderedChain(window=16, max_pending=4096)

    def check() -> None:
        hashes = chain._hashes
        assert chain._low() == (min(hashes) if hashes else 0)

    check()
    for i in range(0, len(blocks), 8):
        batch = blocks[i : i + 8]
        rng.shuffle(batch)
        for block in batch:
            chain.accept(block)
            check()
        roll = rng.random()
        if roll < 0.15 and chain.head is not None:  # a resubscription from further back
            chain.expect_rewind()
            back = max(chain.head[0] - rng.randint(1, 40), 0)
            chain.accept(gen.canonical[back] if back < len(gen.canonical) else batch[0])
            check()
        elif roll < 0.25 and chain.head is not None:  # the producer names an ancestor
            num = max(chain.head[0] - rng.randint(0, 30), 0)
            chain.reorg_to(num, gen.canonical[num].hash)
            check()


def test_a_named_ancestor_never_added_is_never_reported_removed() -> None:
    """A subscriber at a wrong hash is rewound: the producer names the block below the first
    one sent, which the application never had; a later, deeper reorg removes what it added."""
    gen = SyntheticChain(seed=9)
    blocks = gen.take(40)
    chain = OrderedChain(head=(39, b"\x77" * 32))
    assert chain.reorg_to(30, blocks[30].hash) == [Removed(num=39, hash=b"\x77" * 32)]
    assert [u.block.num for u in apply(chain, blocks[31:34])] == [31, 32, 33]
    ups = chain.reorg_to(20, blocks[20].hash)
    assert [(u.num, u.hash) for u in ups] == [(n, blocks[n].hash) for n in (33, 32, 31)]


def test_a_reorg_to_the_parent_of_block_0_starts_over() -> None:
    """A rewound subscriber near 0 is told the ancestor is block 0's parent (the zero hash):
    the chain starts over and block 0 is added (it was held forever, its parent never placed)."""
    blocks = SyntheticChain(seed=10).take(5)
    chain = OrderedChain(head=(1, b"\x77" * 32))
    assert chain.reorg_to(0, bytes(32)) == [Removed(num=1, hash=b"\x77" * 32)]
    assert [u.block.num for u in apply(chain, blocks)] == [0, 1, 2, 3, 4]
