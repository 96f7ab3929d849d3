"""The real cardinal-streams Go consumer, started on a replaced block, through a reorg at its start.

A consumer whose last block was replaced gets a ``reorg`` result naming the
common ancestor, then the heavier branch (the library's ``HandleReorg`` moves
its ``lastHash`` there). The library never saw that ancestor as a block: a
later reorg forking at it or below cannot be linked by the library's processor
(its parent is not among the blocks it finished), and the library queued the
new branch for ever with no error on either side (history checker seed 1062:
a Go consumer joined from a replaced hash at 92, got the ancestor 91 and block
92, then never the heavier 92' nor anything above). The server closes the
connection instead (as for any reorg the library cannot take by weight) and
the library redials from its last block, getting the ancestor named again.
"""

from __future__ import annotations

import pytest

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from tests.integration.chain.conftest import STREAM
from tests.integration.chain.test_cardinal_go import at_head, check_chain


@pytest.mark.parametrize("depth", [1, 2], ids=["sibling-of-the-first-block", "below-the-ancestor"])
async def test_a_reorg_at_the_announced_ancestor_reaches_a_go_consumer_started_on_a_replaced_block(
    settings, serve, go_run, redis_client, depth: int
) -> None:
    gen = SyntheticChain(seed=62)
    write_blocks(redis_client, STREAM, gen.take(30))
    replaced = gen.canonical[-1]
    write_blocks(redis_client, STREAM, gen.reorg(1, 1))  # block 29 replaced by a heavier one
    async with serve(settings) as (base, _app):
        url = base.replace("http://", "ws://") + "/cardinal"
        args = ["-from", str(replaced.num), "-hash", "0x" + replaced.hash.hex()]
        async with go_run("consumer", "-url", url, *args, "-weight", hex(replaced.weight)) as proc:
            await proc.wait_for(lambda: at_head(proc, gen.canonical[-1]), 30, "the fork start")
            reorgs = [line for line in proc.lines if line["event"] == "reorg"]
            assert [r["num"] for r in reorgs] == [replaced.num - 1]
            # a heavier sibling of the block sent after the ancestor, or a branch below it
            write_blocks(redis_client, STREAM, gen.reorg(depth, 1 if depth == 1 else None))
            await proc.wait_for(lambda: at_head(proc, gen.canonical[-1]), 30, "the reorg")
            write_blocks(redis_client, STREAM, gen.take(2))
            await proc.wait_for(lambda: at_head(proc, gen.canonical[-1]), 30, "blocks after")
            stored = {b.num: "0x" + b.hash.hex() for b in gen.canonical}
            check_chain(proc, gen, replaced.num - depth + 1, stored)
