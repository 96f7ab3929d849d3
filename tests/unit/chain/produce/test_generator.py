from __future__ import annotations

from pipeline.blockcodec import decode_block, encode_block
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
