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


def test_a_parent_cycle_holds_a_height_that_lies_and_is_set_aside() -> None:
    a = Node(num=1, hash="a", parent="b", canonical=False)
    b = Node(num=0, hash="b", parent="a", canonical=True)  # b's parent a is at 1, not -1
    plan = plan_walk([a, b], 0)
    assert [n.hash for n in plan.bad] == ["b"] and plan.aside == 2
    assert plan.head is None and plan.mark == () and [n.hash for n in plan.unmark] == ["b"]
    assert not plan.needs_lower


def test_a_height_that_lies_in_the_middle_is_never_canonical() -> None:
    main = _chain(0, 9, "m", "g", False)
    liar = _chain(50, 54, "x", "m4", False, order=100)  # x50 says 50, its parent m4 is at 4
    fork = _chain(5, 8, "f", "m4", False, order=200)  # a correct branch, lighter than main
    plan = plan_walk(main + liar + fork, 0)
    assert plan.head is not None and plan.head.hash == "m8"
    assert [n.hash for n in plan.mark] == [f"m{n}" for n in range(8, -1, -1)]
    assert [n.hash for n in plan.bad] == ["x50"] and plan.aside == 4
    # with main ending at 6, the correct branch is the heaviest and is marked
    short = [n for n in main if n.num <= 6]
    plan = plan_walk(short + liar + fork, 0)
    assert [n.hash for n in plan.mark] == ["f7", "f6", "f5", "m4", "m3", "m2", "m1", "m0"]


def test_a_height_that_lies_downwards_or_marked_before_is_unmarked() -> None:
    main = _chain(0, 6, "m", "g", True)
    low = Node(num=2, hash="y2", parent="m4", canonical=False, weight=10**6)  # 4 is not 1
    marked = Node(num=6, hash="z6", parent="m1", canonical=True)  # marked by an older run
    plan = plan_walk([*main, low, marked], 0)
    assert plan.head is not None and plan.head.hash == "m5"
    assert sorted(n.hash for n in plan.bad) == ["y2", "z6"] and plan.mark == ()
    assert [n.hash for n in plan.unmark] == ["z6"]


def test_a_parent_missing_where_an_honest_height_would_put_it_is_looked_up() -> None:
    window = _chain(100, 105, "m", "m99", False) + _chain(102, 104, "x", "deep", False, order=9)
    heavy = Node(num=104, hash="x104", parent="x103", canonical=False, weight=10**9)
    plan = plan_walk([*window, heavy], 100)
    assert plan.unresolved == ("deep",)  # x102's parent would be at 101, in the window
    lied = plan_walk([*window, heavy], 100, {"deep": 7})
    assert lied.unresolved == () and [n.hash for n in lied.bad] == ["x102"]
    assert lied.head is not None and lied.head.hash == "m104" and lied.needs_lower
    gap = plan_walk([*window, heavy], 100, {"deep": None})  # not in the lake: a gap
    assert gap.head == heavy and [n.hash for n in gap.mark] == ["x104", "x103", "x102"]


def test_a_window_whose_every_block_is_set_aside_looks_lower() -> None:
    liar = Node(num=10**9, hash="x", parent="m5", canonical=False)
    plan = plan_walk([liar], 10**9 - 4096, {"m5": 5})
    assert plan.head is None and plan.needs_lower and plan.aside == 1


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
