"""Continuity check of a stream's canonical chain in the lake (JVM-free, through the reader).

Every canonical block's ``parent`` must be the canonical hash at ``num - 1``;
missing heights between the first and last canonical block are gaps, listed
as inclusive ranges. Heights with two canonical blocks are reported too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.lake.storage.reader import LakeReader
from pipeline.settings import Settings

#: At most this many gaps / broken links / duplicates are listed (``ok`` counts all).
MAX_LISTED = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditReport:
    stream: str
    first: int | None
    last: int | None
    canonical_count: int
    gaps: tuple[tuple[int, int], ...]
    broken_links: tuple[int, ...]
    duplicates: tuple[int, ...] = ()
    ok: bool = True


@dataclass(slots=True)
class Continuity:
    """Accumulates the check over batches of ``(num, hash, parent)`` in ``num`` order (pure)."""

    first: int | None = None
    last: int | None = None
    last_hash: str | None = None
    count: int = 0
    problems: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)
    broken: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)

    def feed(self, rows: Iterable[tuple[int, str, str]]) -> None:
        for num, hash_, parent in rows:
            self.count += 1
            if self.last is None:
                self.first = num
            elif num == self.last:
                self._note(self.duplicates, num)
            elif num != self.last + 1:
                self._note(self.gaps, (self.last + 1, num - 1))
            elif parent != self.last_hash:
                self._note(self.broken, num)
            self.last, self.last_hash = num, hash_

    def _note(self, into: list[object] | list[int] | list[tuple[int, int]], item: object) -> None:
        self.problems += 1
        if len(into) < MAX_LISTED:
            into.append(item)  # type: ignore[arg-type]

    def report(self, stream: str) -> AuditReport:
        return AuditReport(
            stream=stream,
            first=self.first,
            last=self.last,
            canonical_count=self.count,
            gaps=tuple(self.gaps),
            broken_links=tuple(self.broken),
            duplicates=tuple(self.duplicates),
            ok=self.problems == 0,
        )


def audit(settings: Settings, stream: str, *, reader: LakeReader | None = None) -> AuditReport:
    """Check the canonical chain of ``stream`` from its first to its last block."""
    reader = reader or LakeReader(settings.lake)
    check = Continuity()
    for table in reader.iter_canonical_arrow(stream, 0, batch_rows=65536):
        check.feed(
            zip(
                table.column("num").to_pylist(),
                table.column("hash").to_pylist(),
                table.column("parent").to_pylist(),
                strict=True,
            )
        )
    return check.report(stream)
