"""The live terminal view of ``sluice demo`` (rich), built from the supervisor and the counts.

:func:`render` is called about twice a second and returns one renderable:
the URLs and the admin password, the flow (blocks produced, reorgs, the lake's
coverage, the Redis hot window, subscribers, Airflow runs, bus calls, round
trips), the components with their state, and the latest events.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pipeline.demo.activity import Counts
from pipeline.demo.plan import Plan
from pipeline.demo.supervisor import State, Supervisor

_STYLE = {
    State.UP: "green",
    State.STARTING: "yellow",
    State.RESTARTING: "yellow",
    State.WAITING: "dim",
    State.FAILED: "bold red",
    State.STOPPED: "dim",
}


def _ago(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    return f"{max(0, now_ms - ms) / 1000:.0f}s ago"


def _clock(ms: int | None) -> str:
    return "-" if ms is None else time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def links(plan: Plan) -> RenderableType:
    password = plan.admin_password() or "(being generated)"
    grid = Table.grid(padding=(0, 2))
    grid.add_row("status page", f"[link={plan.status_url}]{plan.status_url}[/link]")
    grid.add_row("Airflow UI", f"{plan.airflow_url}  (admin / {password})")
    grid.add_row("websocket", f"{plan.ws_url}   (sluice subscribe --url {plan.ws_url} --from 0)")
    grid.add_row("logs", f"{plan.dir}/<component>.log")
    return grid


def flow(plan: Plan, counts: Counts, subscriber_lines: int) -> RenderableType:
    """One line per stage: produced, archived, hot in Redis, subscribed, Airflow, bus, nodes."""
    stream = counts.stream()
    cov = stream.get("coverage") or {}
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("blocks produced", _produced(stream))
    table.add_row("archived (lake)", _archived(cov))
    table.add_row("hot window (Redis)", _hot_window(plan, counts, stream, cov))
    table.add_row("subscribers", _subscribers(stream, subscriber_lines))
    table.add_row("Airflow sluice_archive", _airflow(counts))
    table.add_row("bus RPC twin 1 -> 2", _bus(counts))
    table.add_row("node round trips", _round_trips(counts))
    if counts.status_error:
        table.add_row("", f"[dim]{counts.status_error}[/dim]")
    return table


def _produced(stream: dict[str, Any]) -> str:
    head = stream.get("head") or {}
    return (
        f"head #{head.get('num', '-')}, {stream.get('blocks_seen', 0)} seen by the server, "
        f"{stream.get('reorg_count', 0)} reorgs"
    )


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _archived(cov: dict[str, Any]) -> str:
    """The lake's coverage in one line; its stretches of consecutive blocks are the
    ``runs`` of the coverage (``run_count`` of them; the list holds the latest only)."""
    if not cov.get("intervals"):
        return "nothing yet: sluice_archive runs every minute"
    stretches = int(cov.get("run_count", len(cov.get("runs") or [])))
    return (
        f"{cov.get('blocks', 0)} blocks in {_count(cov['intervals'], 'interval', 'intervals')}, "
        f"{_clock(cov.get('archived_from_ms'))} .. {_clock(cov.get('archived_to_ms'))}"
        f" ({_count(stretches, 'contiguous stretch', 'contiguous stretches')}, "
        f"{_count(int(cov.get('gap_count', 0)), 'gap', 'gaps')})"
    )


def _hot_window(plan: Plan, counts: Counts, stream: dict[str, Any], cov: dict[str, Any]) -> str:
    hot = stream.get("redis") or {}
    now_ms = int(time.time() * 1000)
    trimmed = (
        f"trimmed below block #{counts.redis_first_num}"
        if counts.trimmed
        else f"not trimmed yet (hot retention {plan.hot_retention_s}s)"
    )
    return (
        f"{hot.get('length', 0)} entries from {_ago(cov.get('trim_point_ms'), now_ms)}; {trimmed}"
    )


def _subscribers(stream: dict[str, Any], subscriber_lines: int) -> str:
    return f"{stream.get('subscribers') or 0} on the server" + (
        f"; the from-0 subscriber got {subscriber_lines} updates"
        if subscriber_lines
        else "; a from-0 subscriber starts once Redis is trimmed"
    )


def _airflow(counts: Counts) -> str:
    last = counts.runs[0] if counts.runs else None
    return (
        f"{counts.runs_ok} run{'s' if counts.runs_ok != 1 else ''} succeeded"
        + (f"; latest {last['state']} for {str(last['start'])[11:16]}-{str(last['end'])[11:16]}"
           if last else "")
        + (f"; {counts.seed}" if counts.seed else "")
        + (" (it was paused: the demo unpaused it)" if counts.unpaused else "")
        + (f"  [dim]{counts.airflow_error}[/dim]" if counts.airflow_error else "")
    )  # fmt: skip


def _bus(counts: Counts) -> str:
    latency = f", last {counts.rpc_last_ms:.0f} ms" if counts.rpc_last_ms is not None else ""
    return f"{counts.rpc_ok} ok, {counts.rpc_failed} failed{latency}" + (
        f"  [dim]{counts.rpc_error}[/dim]" if counts.rpc_failed else ""
    )


def _round_trips(counts: Counts) -> str:
    trips = counts.round_trips
    return (
        f"a -> b over streams: {trips.get('node-a', 0)}, "
        f"b -> a over Dialogue/TCP: {trips.get('node-b', 0)}"
    )


def components(supervisor: Supervisor) -> RenderableType:
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for column in ("component", "state", "pid", "up after", "restarts"):
        table.add_column(column, no_wrap=True)
    table.add_column("what", overflow="ellipsis", no_wrap=True)
    for child in supervisor.children.values():
        state = child.state
        table.add_row(
            child.component.name,
            Text(state.value + (f" ({child.error})" if child.error and state is State.FAILED else ""),
                 style=_STYLE[state]),
            str(child.pid or "-"),
            f"{child.up_after_s:.1f}s" if child.up_after_s is not None else "-",
            str(child.restarts),
            child.component.role,
        )  # fmt: skip
    return table


def render(
    plan: Plan,
    supervisor: Supervisor,
    counts: Counts,
    events: deque[str],
    *,
    progress: RenderableType | None = None,
    subscriber_lines: int = 0,
    footer: str = "",
) -> RenderableType:
    parts: list[Any] = [Panel(links(plan), title="Sluice demo", border_style="cyan")]
    if progress is not None:
        parts.append(Panel(progress, title="starting", border_style="yellow"))
    parts.append(Panel(flow(plan, counts, subscriber_lines), title="the flow"))
    parts.append(Panel(components(supervisor), title="components"))
    if events:
        parts.append(Panel("\n".join(events), title="events", border_style="dim"))
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)
