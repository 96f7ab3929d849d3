from __future__ import annotations

import pytest

from pipeline.blockcodec import Block, decode_block, effective_weight, encode_block
from pipeline.chain.produce.generator import GENESIS_PARENT, SyntheticChain


def test_linear_chain_links():
    chain = SyntheticChain(seed=1)
    blocks = chain.take(10)
    assert [b.num for b in blocks] == list(range(10))
    assert blocks[0].parent == GENESIS_PARENT
    for prev, cur in zip(blocks, blocks[1:], strict=False):
        assert cur.parent == prev.hash
    assert decode_block(encode_block(blocks[3])) == blocks[3]


def test_reorg_replaces_branch_and_stays_linked():
    chain = SyntheticChain(seed=2, reorg_every=5, reorg_depth=3)
    emitted = chain.take(40)
    assert chain.reorgs >= 1
    assert len(emitted) > len(chain.canonical) - 0  # reorged blocks were emitted too
    canon = chain.canonical
    assert [b.num for b in canon] == list(range(len(canon)))
    for prev, cur in zip(canon, canon[1:], strict=False):
        assert cur.parent == prev.hash
    canon_hashes = {b.hash for b in canon}
    assert any(b.hash not in canon_hashes for b in emitted)


def test_deterministic():
    a = SyntheticChain(seed=7, reorg_every=3).take(20)
    b = SyntheticChain(seed=7, reorg_every=3).take(20)
    assert a == b


# --- going on from a stream's last entries: a suffix of the chain, not block 0 (issue 30) ---

LOW, HEAD = 2_600, 2_699  # the suffix continue_from loads: heights LOW..HEAD


@pytest.fixture(scope="module")
def suffix() -> list[Block]:
    """Heights LOW..HEAD of one chain, as a stream's last entries would hold them."""
    return SyntheticChain(seed=11).take(HEAD + 1)[LOW:]


def _continued(suffix: list[Block], **kwargs: int) -> SyntheticChain:
    chain = SyntheticChain(seed=12, **kwargs)
    head = chain.continue_from(suffix)
    assert head == suffix[-1] and chain.canonical == suffix
    return chain


def _check_branch(known: dict[bytes, Block], branch: list[Block], old_head: Block) -> None:
    """Each block one above its parent, the parent known (loaded or emitted), heavier than it;
    the branch's last block heavier than the head it replaces."""
    for block in branch:
        parent = known.get(block.parent)
        assert parent is not None, f"block {block.num}: parent not in the chain"
        if block.num != parent.num + 1:
            pytest.fail(f"block {block.num} written as the child of {parent.num}")
        assert _weight(block) > _weight(parent)
        known[block.hash] = block
    assert _weight(branch[-1]) > _weight(old_head)


def test_reorg_after_continue_from_a_suffix_uses_heights_not_lengths(suffix: list[Block]) -> None:
    for depth in range(1, HEAD - LOW + 1):  # down to the fork parent LOW, the lowest loaded
        chain = _continued(suffix)
        branch = chain.reorg(depth)
        assert [b.num for b in branch] == list(range(HEAD - depth + 1, HEAD + 2))
        assert branch[0].parent == suffix[-1 - depth].hash  # the fork parent: height HEAD - depth
        _check_branch({b.hash: b for b in suffix}, branch, suffix[-1])
        assert chain.canonical == [*suffix[: len(suffix) - depth], *branch]


def test_shorter_heavier_reorg_after_continue_from(suffix: list[Block]) -> None:
    for depth in (1, 2, 5, 50, HEAD - LOW):
        for length in sorted({1, max(1, depth // 2), depth, depth + 3}):
            chain = _continued(suffix)
            branch = chain.reorg(depth, length)
            assert [b.num for b in branch] == list(
                range(HEAD - depth + 1, HEAD - depth + 1 + length)
            )
            _check_branch({b.hash: b for b in suffix}, branch, suffix[-1])
            assert chain.head == branch[-1]


def test_reorg_never_goes_below_the_first_block_loaded(suffix: list[Block]) -> None:
    chain = _continued(suffix)
    with pytest.raises(ValueError, match=f"below {LOW}"):
        chain.reorg(HEAD - LOW + 1)  # its fork parent would be LOW - 1: not loaded
    with pytest.raises(ValueError, match="depth"):
        chain.reorg(0)
    with pytest.raises(ValueError, match="length"):
        chain.reorg(3, 0)
    assert chain.canonical == suffix  # a refused reorg changes nothing


def test_step_reorgs_within_what_is_loaded(suffix: list[Block]) -> None:
    """Reorgs as deep as allowed, every step: each branch forks at or above LOW."""
    chain = _continued(suffix[-8:], reorg_every=1, reorg_depth=1_000)  # heights HEAD-7..HEAD
    known = {b.hash: b for b in suffix[-8:]}
    for _ in range(200):
        old_head = chain.head
        assert old_head is not None
        branch = chain.step()
        _check_branch(known, branch, old_head)
        assert known[branch[0].parent].num >= HEAD - 7
    assert chain.reorgs == 200


def test_continue_from_keeps_only_the_linked_part(suffix: list[Block]) -> None:
    gap = [b for b in suffix if b.num != 2_650]  # the stream lost one entry
    chain = SyntheticChain(seed=13)
    assert chain.continue_from(gap) == suffix[-1]
    assert [b.num for b in chain.canonical] == list(range(2_651, HEAD + 1))
    with pytest.raises(ValueError, match="below 2651"):
        chain.reorg(HEAD - 2_650)
    branch = chain.reorg(HEAD - 2_651)  # the fork parent is 2651, the lowest linked
    assert branch[0].num == 2_652 and branch[0].parent == suffix[51].hash


def test_continue_from_a_stream_with_reorgs(suffix: list[Block]) -> None:
    """The stream's entries hold replaced branches too: the heaviest head's ancestors are kept."""
    first = SyntheticChain(seed=14, reorg_every=3, reorg_depth=4)
    first.take(400)
    entries = first.emitted[-256:]
    chain = SyntheticChain(seed=15, reorg_every=2, reorg_depth=4)
    assert chain.continue_from(entries) == first.canonical[-1]
    low = chain.canonical[0].num
    assert chain.canonical == first.canonical[low:]
    known = {b.hash: b for b in entries}
    for _ in range(100):
        old_head = chain.head
        assert old_head is not None
        branch = chain.step()
        _check_branch(known, branch, old_head)
        assert old_head.num - known[branch[0].parent].num <= 4  # never deeper than reorg_depth


def _weight(block: Block) -> int:
    return effective_weight(block.num, block.weight)
