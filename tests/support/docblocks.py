"""The fenced code blocks of the README and of the documentation site under docs/.

A block of a language the docs tests run (Python, shell) either runs as it
stands, or says why not on the line right before its fence:

- ``<!-- not-run: REASON -->``: it cannot run in a test (a service, a port, a
  long-running process); it is still compiled or syntax-checked;
- ``<!-- run-by: tests/PATH.py -->``: that test runs it, reading it from its page.

Tests that run a page's block pick it with :func:`page_blocks`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

PYTHON = frozenset({"python", "py"})
SHELL = frozenset({"sh", "bash", "shell", "console"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"^\s*<!-- (?P<kind>not-run|run-by): (?P<why>.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and what its marker says."""

    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str  # "run", "not-run" or "run-by"
    why: str = ""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs_here(self) -> bool:
        return self.kind == "run"


def pages() -> list[Path]:
    """The README and every Markdown page of the site (docs/hooks holds code, not pages)."""
    found = [README, *sorted(DOCS.rglob("*.md"))]
    return [path for path in found if "hooks" not in path.relative_to(ROOT).parts]


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of ``path``, whatever its language."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        indent, fence = len(opened["indent"]), opened["fence"]
        marker = _MARKER.match(lines[i - 1]) if i else None
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        out.append(
            Block(
                path=str(path.relative_to(ROOT)),
                line=i + 1,
                lang=opened["lang"].lower(),
                code="\n".join(body) + "\n",
                kind=marker["kind"] if marker else "run",
                why=marker["why"] if marker else "",
            )
        )
        i = j + 1
    return out


def checked_blocks() -> list[Block]:
    """The Python and shell blocks of every page: the ones the docs tests hold to account."""
    return [b for path in pages() for b in blocks_of(path) if b.lang in PYTHON | SHELL]


def page_blocks(relative: str, langs: frozenset[str], marker: str = "") -> list[str]:
    """The code of ``relative``'s blocks in ``langs`` that contain ``marker``."""
    return [b.code for b in blocks_of(ROOT / relative) if b.lang in langs and marker in b.code]


def shell_commands(block: Block) -> str:
    """The script a shell block runs: a ``console`` block's ``$ `` lines, else the block."""
    if block.lang != "console":
        return block.code
    return "".join(line[2:] + "\n" for line in block.code.splitlines() if line.startswith("$ "))
