"""The demo's processes as the kernel sees them: found by a marker, measured, signalled.

Every process the demo starts carries ``SLUICE_DEMO_ID=<id>`` in its
environment, and so does everything those processes start (Airflow's
scheduler and task runners, Spark's JVM and Python workers), because a child
inherits its parent's environment. Walking ``/proc`` for that marker finds
them all, whatever process group or session they moved to: that is how the
demo measures its memory and how it makes sure nothing outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

#: The environment variable set on every demo child.
MARKER = "SLUICE_DEMO_ID"

_PROC = Path("/proc")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def marked_pids(demo_id: str, proc: Path = _PROC) -> list[int]:
    """Pids of live processes whose environment has ``SLUICE_DEMO_ID=demo_id`` (not this one).

    Zombies are left out (their environment reads as empty): they hold no
    memory and are reaped by their parent.
    """
    needle = f"{MARKER}={demo_id}".encode()
    found: list[int] = []
    mine = ancestors(proc)
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            env = (entry / "environ").read_bytes()
            # redis-server writes its title over argv and environ: the demo puts the
            # marker in the title instead (proc-title-template)
            cmd = (entry / "cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in env.split(b"\0") or needle in cmd:
            found.append(int(entry.name))
    return found


def ancestors(proc: Path = _PROC) -> set[int]:
    """This process and its ancestors: never swept, even when they carry the marker."""
    seen: set[int] = set()
    pid: int | None = os.getpid()
    while pid is not None and pid > 1 and pid not in seen:
        seen.add(pid)
        pid = parent_of(pid, proc)
    return seen


def rss_bytes(pids: list[int], proc: Path = _PROC) -> int:
    """Resident memory of ``pids`` summed (pages shared between them are counted in each)."""
    total = 0
    for pid in pids:
        try:
            fields = (proc / str(pid) / "statm").read_text().split()
        except OSError:
            continue
        total += int(fields[1]) * _PAGE
    return total


def parent_of(pid: int, proc: Path = _PROC) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    return int(stat.rpartition(")")[2].split()[1])


def rss_by_root(pids: list[int], roots: dict[int, str], proc: Path = _PROC) -> dict[str, int]:
    """RSS of ``pids`` summed per root: each pid counts for the nearest ancestor in ``roots``
    (pid -> name); pids with no such ancestor count for ``"other"``."""
    totals: dict[str, int] = {}
    for pid in pids:
        at: int | None = pid
        seen = 0
        while at is not None and at > 1 and at not in roots and seen < 64:
            at, seen = parent_of(at, proc), seen + 1
        name = roots.get(at, "other") if at is not None else "other"
        totals[name] = totals.get(name, 0) + rss_bytes([pid], proc)
    return totals


def in_tree(root: int, pids: list[int], proc: Path = _PROC) -> list[int]:
    """Those of ``pids`` that are ``root`` or descend from it."""
    found = []
    for pid in pids:
        at: int | None = pid
        seen = 0
        while at is not None and at > 1 and at != root and seen < 64:
            at, seen = parent_of(at, proc), seen + 1
        if at == root:
            found.append(pid)
    return found


def cpu_seconds(pids: list[int], proc: Path = _PROC) -> float:
    """CPU seconds ``pids`` used, their children that exited and were waited for included."""
    total = 0
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            continue
        # after "pid (comm)": state is field 3; utime, stime, cutime, cstime are 14 to 17
        fields = stat.rpartition(")")[2].split()
        total += sum(int(v) for v in fields[11:15])
    return total / _TICKS


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """``killpg`` that treats a group already gone as done; True if it was signalled."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_pids(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def command_line(pid: int, proc: Path = _PROC) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
