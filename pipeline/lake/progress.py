"""Progress of long lake work (backfills, replays): a bar on a terminal, rate lines elsewhere.

:class:`Meter` is the pure part: steps done of a known total, items moved,
rates and an ETA from an injected clock. :func:`reporter` picks the sink:

- on a terminal (the story stream is a TTY), a rich progress bar: steps done
  / total, items, items/s, ETA. Log lines written meanwhile appear above the
  bar instead of tearing it. rich comes with ``[demo]``, not ``[lake]``: without
  it a terminal gets the rate lines too;
- otherwise (Airflow task logs, CI, a pipe), one INFO line at most every
  :data:`RATE_EVERY_S` seconds and a last one when the work ends, e.g.
  ``progress: 12/40 intervals (30%), 34,500 entries, 2,300 entries/s, ETA 1m10s``.

Callers rely on: :meth:`Reporter.advance` is cheap (no I/O unless a line is
due), :meth:`Reporter.close` always prints the final figures once, and
nothing is written to stdout (it carries the job's JSON result).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

log = logging.getLogger("pipeline.lake.job")

#: Seconds between two rate lines when no terminal shows a bar.
RATE_EVERY_S = 5.0


def duration(seconds: float) -> str:
    """``75.4`` -> ``"1m15s"``; ``3725`` -> ``"1h02m"``; under a minute ``"42s"``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@dataclass(slots=True)
class Meter:
    """Counts of one piece of long work; the rates are over the whole run so far."""

    total: int
    step_unit: str
    item_unit: str
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    items: int = 0
    began: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.began = self.clock()

    def advance(self, steps: int = 1, items: int = 0) -> None:
        self.done += steps
        self.items += items

    @property
    def elapsed(self) -> float:
        return max(self.clock() - self.began, 1e-9)

    @property
    def item_rate(self) -> float:
        return self.items / self.elapsed

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before the first step)."""
        if self.done <= 0:
            return None
        return max(self.total - self.done, 0) * self.elapsed / self.done

    def line(self) -> str:
        """The figures in one line (what the non-terminal sink logs)."""
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        eta = self.eta_s
        tail = f", ETA {duration(eta)}" if eta is not None and self.done < self.total else ""
        if self.done >= self.total:
            tail = f", in {duration(self.elapsed)}"
        items = (
            f", {self.items:,} {self.item_unit}, {self.item_rate:,.0f} {self.item_unit}/s"
            if self.item_unit != self.step_unit
            else f", {self.item_rate:,.0f} {self.item_unit}/s"
        )
        return f"progress: {self.done:,}/{self.total:,} {self.step_unit}{pct}{items}{tail}"


class Reporter:
    """Shows a :class:`Meter`; made by :func:`reporter`."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def advance(self, steps: int = 1, items: int = 0) -> None:
        self.meter.advance(steps, items)

    def close(self) -> None:
        log.info("%s", self.meter.line())

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LineReporter(Reporter):
    """One INFO rate line at most every ``every_s`` seconds, and one at the end."""

    def __init__(self, meter: Meter, every_s: float = RATE_EVERY_S) -> None:
        super().__init__(meter)
        self.every_s = every_s
        self._next = meter.clock() + every_s

    def advance(self, steps: int = 1, items: int = 0) -> None:
        super().advance(steps, items)
        now = self.meter.clock()
        if now >= self._next and self.meter.done < self.meter.total:
            self._next = now + self.every_s
            log.info("%s", self.meter.line())


class BarReporter(Reporter):
    """A rich progress bar on ``stream`` (a terminal); log lines go above it meanwhile."""

    def __init__(self, meter: Meter, title: str, stream: TextIO) -> None:
        from rich.console import Console
        from rich.file_proxy import FileProxy
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        super().__init__(meter)
        console = Console(file=stream)
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(meter.step_unit),
            TextColumn("{task.fields[figures]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            redirect_stdout=False,
            redirect_stderr=False,
            transient=False,
        )
        self._task = self._bar.add_task(title, total=meter.total, figures=self._figures())
        # The story's log handlers write to ``stream``: through the proxy their
        # lines are printed above the bar instead of over it.
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []
        proxy = FileProxy(console, stream)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
                self._handlers.append((handler, handler.setStream(proxy)))
        self._bar.start()

    def _figures(self) -> str:
        m = self.meter
        if m.item_unit == m.step_unit:
            return f"{m.item_rate:,.0f} {m.item_unit}/s"
        return f"{m.items:,} {m.item_unit}  {m.item_rate:,.0f} {m.item_unit}/s"

    def advance(self, steps: int = 1, items: int = 0) -> None:
        super().advance(steps, items)
        self._bar.update(self._task, completed=self.meter.done, figures=self._figures())

    def close(self) -> None:
        self._bar.update(self._task, completed=self.meter.done, figures=self._figures())
        self._bar.stop()
        for handler, previous in self._handlers:
            handler.setStream(previous)
        self._handlers.clear()
        super().close()


def reporter(
    title: str,
    total: int,
    step_unit: str,
    item_unit: str,
    *,
    stream: TextIO,
    tty: bool | None = None,
    every_s: float = RATE_EVERY_S,
) -> Reporter:
    """A bar when ``stream`` is a terminal (or ``tty`` says so) and rich is installed,
    else rate lines."""
    meter = Meter(total=total, step_unit=step_unit, item_unit=item_unit)
    if tty is None:
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
    if tty and importlib.util.find_spec("rich") is not None:
        return BarReporter(meter, title, stream)
    return LineReporter(meter, every_s)
