from __future__ import annotations

from pipeline.lake.canonical import Node, plan_walk


def _chain(
    start: int, stop: int, branch: str, parent: str, canonical: bool, order: int = 0
) -> list[Node]:
    nodes, prev = [], parent
    for num in range(start, stop):
        h = f"{branch}{num}"
        nodes.append(
            Node(num=num, hash=h, parent=prev, canonical=canonical, order=(order + num, 0))
        )
        prev = h
    return nodes


def test_fresh_chain_is_marked_down_to_genesis() -> None:
    plan = plan_walk(_chain(0, 5, "m", "g", False), 0)
    assert plan.head is not None and plan.head.hash == "m4"
    assert [n.num for n in plan.mark] == [4, 3, 2, 1, 0] and plan.unmark == ()
    assert not plan.needs_lower


def test_reorg_unmarks_the_old_branch_and_stops_at_the_join() -> None:
    main = _chain(0, 6, "m", "g", True)
    fork = _chain(4, 7, "f", "m3", False, order=100)
    plan = plan_walk(main + fork, 0)
    assert [n.hash for n in plan.mark] == ["f6", "f5", "f4"]
    assert sorted(n.hash for n in plan.unmark) == ["m4", "m5"]


def test_head_tie_goes_to_the_block_seen_first() -> None:
    main = _chain(0, 3, "m", "g", True)
    late = Node(num=2, hash="x2", parent="m1", canonical=False, order=(999, 0))
    plan = plan_walk([*main, late], 0)
    assert plan.head is not None and plan.head.hash == "m2"
    assert plan.mark == () and plan.unmark == ()


def test_heavier_block_at_the_same_height_wins() -> None:
    main = _chain(0, 3, "m", "g", True)
    late = Node(num=2, hash="x2", parent="m1", canonical=False, order=(999, 0), weight=4)
    plan = plan_walk([*main, late], 0)
    assert plan.head == late
    assert [n.hash for n in plan.mark] == ["x2"] and [n.hash for n in plan.unmark] == ["m2"]


def test_shorter_heavier_chain_is_canonical() -> None:
    main = [
        Node(num=n, hash=f"m{n}", parent=f"m{n - 1}" if n else "g", canonical=True,
             order=(n, 0), weight=10 * (n + 1))
        for n in range(10)
    ]  # fmt: skip
    short = [
        Node(num=7, hash="s7", parent="m6", canonical=False, order=(50, 0), weight=75),
        Node(num=8, hash="s8", parent="s7", canonical=False, order=(51, 0), weight=101),
    ]
    plan = plan_walk(main + short, 0)
    assert plan.head is not None and plan.head.hash == "s8"
    assert [n.hash for n in plan.mark] == ["s8", "s7"]
    assert sorted(n.hash for n in plan.unmark) == ["m7", "m8", "m9"]


def test_rows_without_weight_weigh_num_plus_one() -> None:
    old = _chain(0, 5, "m", "g", True)  # weights None: 1..5
    new = Node(num=3, hash="w3", parent="m2", canonical=False, order=(99, 0), weight=6)
    plan = plan_walk([*old, new], 0)
    assert (
        plan.head == new
        and Node(num=4, hash="a", parent="b", canonical=False).effective_weight == 5
    )


def test_already_canonical_head_changes_nothing() -> None:
    plan = plan_walk(_chain(0, 4, "m", "g", True), 0)
    assert plan.mark == () and plan.unmark == ()
    assert plan_walk([], 0).head is None


def test_window_bottom_asks_for_more_and_gap_stops() -> None:
    window = _chain(10, 15, "m", "m9", False)
    assert plan_walk(window, 10).needs_lower
    gapped = _chain(0, 3, "m", "g", False) + _chain(5, 8, "m", "m4", False)
    plan = plan_walk(gapped, 0)
    assert [n.num for n in plan.mark] == [7, 6, 5] and not plan.needs_lower


def test_parent_cycle_terminates() -> None:
    a = Node(num=1, hash="a", parent="b", canonical=False)
    b = Node(num=0, hash="b", parent="a", canonical=False)
    assert len(plan_walk([a, b], 0).mark) == 2


def test_blocks_filled_in_below_the_marked_chain_are_marked() -> None:
    # 10-19 marked by an earlier run; 0-9 archived later (a backfill or a catch-up).
    old = _chain(0, 10, "m", "g", False)
    marked = _chain(10, 20, "m", "m9", True)
    plan = plan_walk(old + marked, 0)
    assert [n.num for n in plan.mark] == list(range(9, -1, -1)) and plan.unmark == ()


def test_a_hole_under_the_marked_chain_beside_a_dead_fork_is_marked_on_the_chain() -> None:
    chain = _chain(0, 8, "m", "g", True)
    hole = [
        n if n.num != 3 else Node(num=3, hash="m3", parent="m2", canonical=False) for n in chain
    ]
    dead = Node(num=3, hash="x3", parent="m2", canonical=False, order=(999, 0))
    plan = plan_walk([*hole, dead], 0)
    assert [n.hash for n in plan.mark] == ["m3"] and plan.unmark == ()


def test_heights_above_a_shorter_heavier_head_do_not_keep_the_walk_going() -> None:
    short = _chain(0, 3, "m", "g", True)
    long_dead = _chain(3, 6, "d", "m2", False)  # unmarked above the head: not a hole
    heavy = Node(num=3, hash="h3", parent="m2", canonical=True, weight=1000)
    plan = plan_walk([*short, *long_dead, heavy], 0)
    assert plan.head is not None and plan.head.hash == "h3"
    assert plan.mark == () and plan.unmark == ()
