"""``sluice demo --check``: the live system as a scripted scenario with a deadline.

1. Start everything (as ``sluice demo`` does, with a faster producer and a
   15 s hot window) and let ``sluice_archive`` run through Airflow and the
   Connect server on its one-minute schedule.
2. Wait until a bus call and both node round trips succeeded, and Redis no
   longer holds block 0 (an archive run trimmed it).
3. Subscribe to ``sluice serve`` from block 0 while blocks and reorgs keep
   coming; once it caught up, follow the live chain for ``--follow`` seconds
   (:data:`LIVE_S` by default).
4. Stop the producer (the head stops moving) and compute the expected
   canonical chain from the lake (the JVM-free reader) and Redis together.
5. The subscriber's chain must become exactly that chain, each block once,
   in order (reorgs show as removals of the tip) and nothing more may arrive
   for :data:`QUIET_S`; the server's head and Redis's head must be the
   expected head; every canonical block of the lake must be on the expected
   chain (the newest ``reorg depth`` lake blocks may wait for the next
   canonical run).

Prints a summary table; exit 0 when every row passed, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
from rich.console import Console
from rich.table import Table

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, decode_block
from pipeline.chain.client.consumer import subscribe
from pipeline.demo.activity import Activity, Counts
from pipeline.demo.options import LIVE_S
from pipeline.demo.plan import STREAM, Plan
from pipeline.demo.supervisor import Supervisor
from pipeline.demo.verify import Follower, Known, canonical_chain
from pipeline.errors import BrokenChain, DemoTimeout
from pipeline.redisio import conn as redisconn
from pipeline.settings import LakeSettings

#: Seconds the subscriber keeps listening after it reached the expected head.
QUIET_S = 3.0
#: Seconds the subscriber may take to catch up with the expected head.
CATCH_UP_S = 120.0


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    ok: bool
    detail: str


async def _until(what: str, cond: Callable[[], bool], deadline: float, stop: asyncio.Event) -> None:
    while not cond():
        if stop.is_set():
            raise DemoTimeout(f"interrupted while waiting for {what}")
        if time.monotonic() > deadline:
            raise DemoTimeout(f"deadline passed while waiting for {what}")
        await asyncio.sleep(0.5)


async def run_check(
    plan: Plan,
    supervisor: Supervisor,
    console: Console,
    stop: asyncio.Event,
    started: float,
    deadline_s: float,
    event: Callable[[str], None],
    follow_s: float = LIVE_S,
) -> int:
    from pipeline.demo.startup import progress_bar, running, start_all, warmer

    deadline = started + deadline_s
    rows: list[Row] = []
    figures: dict[str, str] = {}
    activity = Activity(plan, supervisor.is_up)
    counts = activity.counts
    progress = progress_bar()
    try:
        async with running(activity, supervisor):
            up_s = await start_all(supervisor, progress, stop, event, warmer(plan, event))
            if stop.is_set():
                return 130
            figures["time to all up"] = f"{up_s:.1f}s"
            event(f"all up in {up_s:.1f}s; RSS {supervisor.rss_bytes() / 2**20:.0f} MiB")
            rss_peak = await _until_trimmed(supervisor, counts, deadline, stop, event, figures)
            rows += await _subscribe_and_compare(
                plan, supervisor, counts, deadline, stop, event, follow_s
            )
            rows += _traffic_rows(supervisor, counts)
            figures["RSS of the demo"] = f"{rss_peak / 2**20:.0f} MiB"
            figures["archive runs ok"] = str(counts.runs_ok)
    except DemoTimeout as exc:
        rows.append(Row("scenario", False, str(exc)))
    figures["check took"] = f"{time.monotonic() - started:.1f}s"
    _print(console, rows, figures)
    return 0 if rows and all(r.ok for r in rows) else 1


async def _until_trimmed(
    supervisor: Supervisor,
    counts: Counts,
    deadline: float,
    stop: asyncio.Event,
    event: Callable[[str], None],
    figures: dict[str, str],
) -> int:
    """Wait for the traffic, then for an archive run that trimmed block 0; the peak RSS seen."""
    await _until("the first bus call and node round trips", lambda: (
        counts.rpc_ok > 0 and min(counts.round_trips.get(n, 0) for n in ("node-a", "node-b")) > 0
    ), deadline, stop)  # fmt: skip
    event("bus call and node round trips ok; waiting for an archive run to trim block 0")
    rss_peak = supervisor.rss_bytes()
    await _until(
        "sluice_archive to archive and trim block 0",
        lambda: counts.trimmed and counts.runs_ok > 0,
        deadline,
        stop,
    )
    rss_peak = max(rss_peak, supervisor.rss_bytes())
    by = sorted(supervisor.rss_by_component().items(), key=lambda kv: -kv[1])
    figures["RSS by component"] = ", ".join(f"{n} {b / 2**20:.0f}" for n, b in by) + " MiB"
    event(
        f"Redis trimmed below block {counts.redis_first_num} after {counts.runs_ok} "
        "archive run(s); a subscriber joins from block 0 while blocks and reorgs go on"
    )
    return rss_peak


def _traffic_rows(supervisor: Supervisor, counts: Counts) -> list[Row]:
    """The bus calls, the node round trips, and whether a component had to be restarted."""
    rpc_failed = counts.rpc_failed
    trips = counts.round_trips
    restarts = {n: c.restarts for n, c in supervisor.children.items() if c.restarts}
    return [
        Row("bus RPC twin 1 -> twin 2", counts.rpc_ok > 0 and rpc_failed == 0,
            f"{counts.rpc_ok} calls ok, {rpc_failed} failed "
            f"{counts.rpc_error if rpc_failed else ''}".strip()),
        Row("node round trips", min(trips.values(), default=0) > 0,
            f"a -> b over streams {trips.get('node-a', 0)}, "
            f"b -> a over Dialogue/TCP {trips.get('node-b', 0)}"),
        Row("no component died", not restarts, f"restarts: {restarts or 'none'}"),
    ]  # fmt: skip


#: The row the subscriber from block 0 is judged by.
SUBSCRIBER_ROW = "subscriber from 0: every canonical block once, in order"


async def _subscribe_and_compare(
    plan: Plan,
    supervisor: Supervisor,
    counts: Counts,
    deadline: float,
    stop: asyncio.Event,
    event: Callable[[str], None],
    follow_s: float = LIVE_S,
) -> list[Row]:
    """Subscribe from 0, follow live through reorgs, stop the producer, compare everything."""
    follower = Follower()
    reader = asyncio.create_task(_read(plan.ws_url, follower), name="subscriber")
    error = ""
    try:
        live_reorgs = await _follow_live(follower, reader, counts, deadline, stop, event, follow_s)
        event("stopping the producer")
        await supervisor.stop("produce")
        await asyncio.sleep(1.0)  # the server's tail reads the last entries
        rows, expected, redis_head = await _expected(plan, counts)
        if not expected:
            return rows
        want = await _reach(follower, reader, expected[-1], deadline, stop, event)
    except DemoTimeout as exc:
        error = str(exc)
        return [Row(SUBSCRIBER_ROW, False, error)]
    finally:
        reader.cancel()
        (outcome,) = await asyncio.gather(reader, return_exceptions=True)
        if isinstance(outcome, Exception):
            error = f"{type(outcome).__name__}: {outcome}"
    diffs = follower.compare(expected)
    if error:
        diffs.insert(0, error)
    rows.append(
        Row(SUBSCRIBER_ROW, not diffs,
            f"{follower.added} added, {follower.removed} removed "
            f"({live_reorgs} while following live), {len(follower.chain)} kept"
            + (f"; {'; '.join(diffs[:3])}" if diffs else ""))
    )  # fmt: skip
    server_head = await _server_head(plan)
    rows.append(
        Row("server head = Redis head = expected head",
            server_head == want and redis_head == want,
            f"server #{_fmt(server_head)}, Redis #{_fmt(redis_head)}, expected #{_fmt(want)}")
    )  # fmt: skip
    return rows


async def _follow_live(
    follower: Follower,
    reader: asyncio.Task[None],
    counts: Counts,
    deadline: float,
    stop: asyncio.Event,
    event: Callable[[str], None],
    follow_s: float,
) -> int:
    """Wait for the subscriber to catch up with the head, then follow ``follow_s``; reorgs seen."""
    joined = int((counts.stream().get("head") or {}).get("num", 0))
    await _until(
        f"the subscriber to catch up with block {joined}",
        lambda: reader.done() or (follower.head is not None and follower.head[0] >= joined),
        min(deadline, time.monotonic() + CATCH_UP_S),
        stop,
    )
    added, removed = follower.added, follower.removed
    event(f"the subscriber caught up with block {joined}; following live for {follow_s:g}s")
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(follow_s):
            await stop.wait()
    live_reorgs = follower.removed - removed
    event(
        f"followed live: {follower.added - added} blocks added, {live_reorgs} removed "
        f"(head #{_fmt(follower.head)})"
    )
    return live_reorgs


async def _reach(
    follower: Follower,
    reader: asyncio.Task[None],
    head: Known,
    deadline: float,
    stop: asyncio.Event,
    event: Callable[[str], None],
) -> tuple[int, bytes]:
    """Wait for the subscriber to reach the expected head, then a quiet spell; that head."""
    want = (head.num, head.hash)
    event(f"expected chain: blocks 0..{head.num}; waiting for the subscriber to reach it")
    await _until(
        f"the subscriber to reach block {head.num}",
        lambda: reader.done() or follower.head == want,
        min(deadline, time.monotonic() + CATCH_UP_S),
        stop,
    )
    await asyncio.sleep(QUIET_S)  # anything more would be a duplicate
    return want


async def _expected(
    plan: Plan, counts: Counts
) -> tuple[list[Row], list[Known], tuple[int, bytes] | None]:
    """Rows about the lake and Redis, the expected canonical chain, and Redis's head."""
    redis_blocks, redis_head = await _redis_blocks(plan)
    lake_rows = await asyncio.to_thread(_lake_canonical, plan.lake_settings())
    known = [Known(num=r.num, hash=r.hash, parent=r.parent, weight=r.weight) for r in lake_rows]
    name = "lake + Redis hold one chain from block 0"
    try:
        expected = canonical_chain([*known, *redis_blocks])
    except BrokenChain as exc:
        return [Row(name, False, str(exc))], [], redis_head
    head = expected[-1]
    reorgs = int(counts.stream().get("reorg_count") or 0)
    rows = [
        Row(name, True,
            f"{len(expected)} canonical blocks, head #{head.num}, {reorgs} reorgs; "
            f"{len(lake_rows)} from the lake, Redis from #{counts.redis_first_num}")
    ]  # fmt: skip
    on_chain = {(b.num, b.hash) for b in expected}
    lake_top = max((r.num for r in lake_rows), default=-1)
    # the newest lake blocks may be re-marked by the next canonical run
    settle = plan.reorg_depth
    off = [r for r in lake_rows if (r.num, r.hash) not in on_chain and r.num <= lake_top - settle]
    rows.append(
        Row("lake canonical blocks are on the head's chain", bool(lake_rows) and not off,
            f"lake head #{lake_top}, {len(lake_rows)} canonical rows, {len(off)} off the chain")
    )  # fmt: skip
    return rows, expected, redis_head


def _fmt(head: tuple[int, bytes] | None) -> str:
    return "-" if head is None else f"{head[0]} 0x{head[1].hex()[:10]}"


async def _read(url: str, follower: Follower) -> None:
    """Apply every update of a subscription from block 0 to ``follower``, until cancelled."""
    updates = subscribe(url, 0, None)
    try:
        async for update in updates:
            follower.apply(update)
    finally:
        await updates.aclose()  # type: ignore[attr-defined]


async def _redis_blocks(plan: Plan) -> tuple[list[Known], tuple[int, bytes] | None]:
    client = redisconn.connect(plan.redis_url(), redisconn.Role.CLI)
    try:
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]], await client.xrange(keys.stream(STREAM))
        )
    finally:
        await client.aclose()
    blocks = []
    for _, fields in entries:
        b = decode_block(fields[ENTRY_FIELD])
        blocks.append(Known(num=b.num, hash=b.hash, parent=b.parent, weight=b.weight))
    last = blocks[-1] if blocks else None
    return blocks, (None if last is None else (last.num, last.hash))


def _lake_canonical(lake: LakeSettings) -> list[Any]:
    from pipeline.lake.storage.reader import LakeReader

    reader = LakeReader(lake)
    rows: list[Any] = []
    for batch in reader.iter_canonical(STREAM, 0, None):
        rows += batch
    return rows


async def _server_head(plan: Plan) -> tuple[int, bytes] | None:
    url = f"http://127.0.0.1:{plan.serve_port}/status.json"
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
        doc = await resp.json()
    for stream in doc.get("streams", ()):
        if stream.get("name") == STREAM and stream.get("head"):
            head = stream["head"]
            return int(head["num"]), bytes.fromhex(str(head["hash"])[2:])
    return None


def _print(console: Console, rows: list[Row], figures: dict[str, str]) -> None:
    table = Table(title="sluice demo --check", header_style="bold")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for row in rows:
        table.add_row(row.name, "[green]pass[/]" if row.ok else "[bold red]FAIL[/]", row.detail)
    for name, value in figures.items():
        table.add_row(f"[dim]{name}[/]", "", value)
    console.print(table)
