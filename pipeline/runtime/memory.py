"""Native memory given back to the system after load, for always-on processes that read Arrow.

Python's own live objects are not the problem: after many catch-ups `sluice serve`
held a few MB more in traced Python objects but hundreds of MB more resident.
The rest sits in allocators that keep freed memory for reuse:

- CPython's small-object allocator (pymalloc) carves 1 MiB arenas into 16 KiB
  pools and returns an arena only once every object in it is gone. A catch-up
  burst fills arenas with short-lived objects among a few long-lived ones (the
  tail index's new entries, a log record, a metric), and each survivor pins its
  arena: after the attack soak (tests/bench/abuse_serve_attacks.py, 48
  catch-ups from block 0 and 200 slow-loris peers) 101 arenas held 47 MB of
  objects and 53 MB of empty pools, resident for good, out of reach of
  ``malloc_trim``. :func:`system_malloc` runs the process on glibc's malloc
  instead (``PYTHONMALLOC=malloc``), whose free pages ``malloc_trim`` gives back
  page by page (RSS 1.45x the baseline after that soak with pymalloc, within
  1.2x with malloc). The price: about 10-15% more CPU per block of a
  catch-up (``catchup_cpu_us_per_block`` of ``make bench B=resume``), none
  measurable in live fan-out; ``PYTHONMALLOC=pymalloc`` keeps CPython's own;
- pyarrow's default pool (mimalloc here) reserves 1 GiB arenas and keeps pages
  freed from another thread than the one that allocated them until that thread
  allocates again (the read threads of a catch-up go idle): 658 MB of 1,090 MB
  in one measured serve process;
- delta-rs (the lake's log and file lists) allocates through its own jemalloc,
  which purges freed pages only on later activity unless a background thread
  does it;
- glibc keeps free pages at the top and in the middle of its heaps, and gives
  each new thread an arena of its own, up to eight per core.

:func:`system_malloc` and :func:`tune` (called by ``sluice serve`` before
anything loads pyarrow) point each at returning memory (Python objects on
glibc's malloc, Arrow on the system allocator, jemalloc with background
purging, glibc with few arenas); :class:`Releaser` trims what glibc still
holds once the resident size has grown, from a thread, at most every
``every_s`` seconds. All are no-ops where an allocator is absent (non-glibc
systems) or where the operator chose otherwise (a ``PYTHONMALLOC``,
``ARROW_DEFAULT_MEMORY_POOL`` or ``_RJEM_MALLOC_CONF`` already set).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

#: delta-rs' jemalloc (tikv-jemallocator, prefixed ``_rjem_``) reads this when it starts.
RJEM_CONF_VAR = "_RJEM_MALLOC_CONF"
RJEM_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
#: glibc's mallopt parameter numbers (malloc.h)
_M_ARENA_MAX = -8
#: glibc arenas for a process that reads Arrow from a few threads at once
ARENA_MAX = 2


def _libc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def tune() -> list[str]:
    """Point the native allocators at giving memory back; returns what was changed.

    Call it at the start of the process, before pyarrow is imported: Arrow's
    C++ code (the parquet reader's threads) takes its pool from
    ``ARROW_DEFAULT_MEMORY_POOL`` once, at import, and delta-rs' jemalloc reads
    its setting when it is loaded.
    """
    changed: list[str] = []
    for var, value, what in (
        ("ARROW_DEFAULT_MEMORY_POOL", "system", "arrow pool=system"),
        (RJEM_CONF_VAR, RJEM_CONF, f"delta-rs jemalloc {RJEM_CONF}"),
    ):
        if var not in os.environ:
            os.environ[var] = value
            changed.append(what)
    late = [name for name in ("pyarrow", "deltalake") if name in sys.modules]
    if late:
        log.warning("%s already loaded: its allocator keeps its own settings", " and ".join(late))
    libc = _libc()
    if (
        libc is not None
        and "MALLOC_ARENA_MAX" not in os.environ
        and libc.mallopt(_M_ARENA_MAX, ARENA_MAX) == 1
    ):
        changed.append(f"glibc arenas<={ARENA_MAX}")
    return changed


#: CPython reads it once, at start: which allocator Python objects come from.
PYTHONMALLOC_VAR = "PYTHONMALLOC"


def system_malloc() -> None:
    """Run this process again on glibc's malloc (``PYTHONMALLOC=malloc``); returns if it is.

    Replaces the process (same pid, same arguments, ``sys.orig_argv``) unless
    ``PYTHONMALLOC`` is already set (the operator's choice, or the second run)
    or the C library is not glibc. Call it first thing in a command's process,
    before any thread or open connection.
    """
    if PYTHONMALLOC_VAR in os.environ or _libc() is None:
        return
    os.environ[PYTHONMALLOC_VAR] = "malloc"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is absent)."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


def release() -> None:
    """Give free native memory back now (blocking: call it from a thread)."""
    if "pyarrow" in sys.modules:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class Releaser:
    """Calls :func:`release` while the resident size stays ``growth_bytes`` above its floor.

    The floor is the lowest resident size seen after a release. A release made
    while subscribers still catch up gives back little; the next ones, once they
    left, give back the rest. A release that gives back under 1 MB doubles the
    wait before the next (up to 16 times ``every_s``), so a process whose data
    really grew (its caches filling) is not trimmed every few seconds for
    nothing. ``on_release(before, after)`` is told each time (for metrics).

    Before a release ``collect`` (default: a full :func:`gc.collect`) runs on the
    caller's thread (the event loop's: finalizers stay on it): a server that raised
    the collector's thresholds (``sluice serve``, for its fan-out's latency) keeps
    cyclic garbage longer, and the memory it holds could not be given back.
    It runs only when a release is due (the resident size grew ``growth_bytes``),
    at most every ``every_s`` seconds, and only while ``idle()`` says nobody waits
    on the loop: a full collection stops it for 30-80 ms after a server's catch-ups
    (``fanout_p99_ms`` of ``make bench B=resume`` took the whole pause), and while
    it is busy the collector's own generations run as usual.

    ``prune()`` (if given) drops what the process keeps but no longer uses (the
    history cache's idle files) and says how many things it dropped; :meth:`run`
    calls it every ``every_s`` seconds, from a thread, and releases at once after
    it dropped something, whatever the backoff. It also releases at once, whatever
    the backoff, when ``idle()`` turns true (the last client left), noticed within
    ``every_s`` seconds.
    """

    @property
    def wait_s(self) -> float:
        """Seconds until the next check."""
        return self._wait_s

    def __init__(
        self,
        *,
        every_s: float = 10.0,
        growth_bytes: int = 32 << 20,
        on_release: Callable[[int, int], None] | None = None,
        measure: Callable[[], int] = rss_bytes,
        give_back: Callable[[], None] = release,
        prune: Callable[[], int] | None = None,
        collect: Callable[[], object] = gc.collect,
        idle: Callable[[], bool] = lambda: True,
    ) -> None:
        if every_s <= 0 or growth_bytes < 0:
            raise ValueError("every_s must be positive and growth_bytes non-negative")
        self._every_s = every_s
        self._growth = growth_bytes
        self._on_release = on_release
        self._measure = measure
        self._give_back = give_back
        self._prune = prune
        self._collect = collect
        self._idle = idle
        self._floor = measure()
        self._wait_s = every_s
        self._was_idle = True

    async def run(self) -> None:
        """Check every ``every_s`` seconds (longer after fruitless releases, unless
        ``prune`` dropped something) until cancelled."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self._wait_s
        while True:
            tick = self._every_s if self._prune is not None else due - loop.time()
            await asyncio.sleep(max(min(tick, self._every_s), 0.0))
            if await self.prune():
                due = loop.time()
            due = self.due_after(self._idle(), loop.time(), due)
            if loop.time() >= due:
                await self.check()
                due = loop.time() + self._wait_s

    def due_after(self, idle: bool, now: float, due: float) -> float:
        """When the next check is due, given whether the process is idle now: ``now`` when it
        just became idle (the last client left), whatever the backoff, else ``due``.

        Releases made while clients held their memory gave little and backed off; the
        backoff then kept 760 MB of 200 slow readers' for over two minutes after they
        left (``serve_memory_slow_readers_after_mb`` of ``make bench B=abuse``).
        """
        was_idle, self._was_idle = self._was_idle, idle
        if idle and not was_idle:
            self._wait_s = self._every_s
            return now
        return due

    async def prune(self) -> int:
        """Call ``prune`` (in a thread); what it dropped resets the release backoff."""
        if self._prune is None:
            return 0
        dropped = await asyncio.to_thread(self._prune)
        if dropped:
            self._wait_s = self._every_s
        return dropped

    async def check(self) -> bool:
        """Release if the resident size is past the floor; True if it did."""
        before = self._measure()
        if before - self._floor < self._growth:
            self._floor = min(self._floor, before)
            self._wait_s = self._every_s
            return False
        if self._idle():
            self._collect()
        await asyncio.to_thread(self._give_back)
        after = self._measure()
        self._floor = min(self._floor, after)
        fruitless = before - after < 1 << 20
        self._wait_s = min(self._wait_s * 2, self._every_s * 16) if fruitless else self._every_s
        log.debug("gave back %d MB (%d MB resident)", (before - after) >> 20, after >> 20)
        if self._on_release is not None:
            self._on_release(before, after)
        return True
