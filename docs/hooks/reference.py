"""The reference pages that are generated from the code when the site is built.

An MkDocs hook (``hooks:`` in mkdocs.yml). A page asks for a generated part
with a marker line, replaced before the page is rendered:

- ``<!-- generated: cli -->``: every ``sluice`` command and subcommand with its
  ``--help`` text, as argparse prints it (subcommands found from the parsers
  and from the ``sluice CMD SUB`` lines a command's help names).
- ``<!-- generated: metrics -->``: every metric name the processes register:
  ``sluice serve``'s table (:class:`pipeline.chain.metrics.Metrics`), each
  ``Sample(name=...)`` written in ``pipeline/``, and the node's counters
  (``counters["..."]`` keys, exposed as ``sluice_node_<key>_total``); the
  scan is sluice_docs_metrics.py, beside this file.
- ``<!-- generated: api FACADE -->``: a mkdocstrings block for every name in
  the facade's ``__all__``, at the module that defines it.

An unknown marker fails the build. Also: Sphinx roles left in docstrings are
shown as plain code, and an image a verbatim protocol seed cites but the
repository never had is named in words. ``tests/unit/docs/`` imports this
module to check that what it generates covers the code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Beside this file (MkDocs puts a hook's folder on sys.path while it loads it).
from sluice_docs_metrics import metrics_reference, package_nodes
from sluice_docs_metrics import parsed_package as parsed_package

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: (?P<what>[a-z]+)(?: (?P<arg>[\w.]+))? -->$", re.M)

#: The declared Python API: the package and one facade per part (tests/unit/api).
FACADES = (
    "pipeline",
    "pipeline.routing",
    "pipeline.streams",
    "pipeline.bus",
    "pipeline.dialogue",
    "pipeline.chain",
    "pipeline.lake",
)


# --- the CLI ------------------------------------------------------------------------------


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    """No SLUICE_* setting or config file of the machine, a fixed width: the same text
    whoever builds the site."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("SLUICE_"):
            del os.environ[name]
    os.environ["SLUICE_CONFIG"] = "/dev/null"
    os.environ["COLUMNS"] = "80"  # the width of the page's code blocks
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _parsers_made() -> Iterator[list[argparse.ArgumentParser]]:
    """Every ArgumentParser built inside the block."""
    made: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.__init__

    def record(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    argparse.ArgumentParser.__init__ = record  # type: ignore[method-assign]
    try:
        yield made
    finally:
        argparse.ArgumentParser.__init__ = original  # type: ignore[method-assign]


def command_help(argv: list[str]) -> tuple[str, list[argparse.ArgumentParser]]:
    """``sluice ARGV --help`` as printed, and the parsers it built (run in this process)."""
    from pipeline.cli import COMMANDS

    module = importlib.import_module(COMMANDS[argv[0]][0])
    out = io.StringIO()
    with (
        _parsers_made() as parsers,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.suppress(SystemExit),
    ):
        module.main([*argv[1:], "--help"])
    return out.getvalue(), parsers


def _subcommands(name: str, text: str, parsers: list[argparse.ArgumentParser]) -> list[str]:
    """The subcommands of ``sluice NAME``: argparse subparsers, and the ``sluice NAME SUB``
    lines of its help that are commands of their own."""
    found: list[str] = []
    for parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [sub for sub in action.choices if sub not in found]
    for sub in re.findall(rf"sluice {name} ([a-z][a-z-]*)", text):
        if sub in found:
            continue
        sub_text, _ = command_help([name, sub])
        if sub_text.startswith(f"usage: sluice {name} {sub}"):
            found.append(sub)
    return found


@dataclass(frozen=True)
class Command:
    """One command line of the CLI reference: its words and its ``--help`` text."""

    argv: tuple[str, ...]
    help: str
    parsers: tuple[argparse.ArgumentParser, ...]


def commands() -> list[Command]:
    """Every command and subcommand of ``sluice``, in the order ``sluice --help`` lists them."""
    from pipeline.cli import COMMANDS

    out: list[Command] = []
    with _clean_environment():
        for name in COMMANDS:
            text, parsers = command_help([name])
            out.append(Command((name,), text, tuple(parsers)))
            for sub in _subcommands(name, text, parsers):
                sub_text, sub_parsers = command_help([name, sub])
                out.append(Command((name, sub), sub_text, tuple(sub_parsers)))
    return out


def cli_reference() -> str:
    from pipeline.cli import COMMANDS, _usage

    with _clean_environment():
        top = _usage()
    lines = ["## sluice", "", "```text", top, "```", ""]
    for command in commands():
        words = " ".join(command.argv)
        level = "##" if len(command.argv) == 1 else "###"
        lines += [f"{level} sluice {words}", ""]
        if len(command.argv) == 1:
            lines += [COMMANDS[command.argv[0]][1].capitalize() + ".", ""]
        lines += ["```text", command.help.rstrip(), "```", ""]
    return "\n".join(lines)


# --- the Python API -----------------------------------------------------------------------


def api_targets(facade: str) -> list[tuple[str, str]]:
    """``(name, dotted path of its definition)`` for every name the facade declares."""
    module = importlib.import_module(facade)
    out: list[tuple[str, str]] = []
    for name in module.__all__:
        obj = getattr(module, name)
        where = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if not isinstance(where, str) or not isinstance(qualname, str):
            continue  # a plain value (__version__): no docstring of its own
        out.append((name, f"{where}.{qualname}"))
    return out


def api_reference(facade: str) -> str:
    if facade not in FACADES:
        raise ValueError(f"{facade} is not a declared facade: {', '.join(FACADES)}")
    lines: list[str] = []
    for _, target in api_targets(facade):
        lines += [f"::: {target}", ""]
    return "\n".join(lines)


# --- the hook -----------------------------------------------------------------------------


def generate(what: str, arg: str | None) -> str:
    if what == "cli":
        return cli_reference()
    if what == "metrics":
        return metrics_reference()
    if what == "api" and arg:
        return api_reference(arg)
    raise ValueError(f"unknown generated part {what!r} {arg or ''}")


_CACHE: dict[tuple[str, str | None], str] = {}


def expand(markdown: str) -> str:
    """``markdown`` with every marker replaced by what it asks for."""

    def replace(match: re.Match[str]) -> str:
        key = (match["what"], match["arg"])
        if key not in _CACHE:
            _CACHE[key] = generate(*key)
        return _CACHE[key]

    return MARKER.sub(replace, markdown)


_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)")


def missing_seed_images(markdown: str, page_dir: Path) -> str:
    """The protocol seeds are kept verbatim, images they cite included; one the
    repository never had (seed 002's schema) is named in words instead of a broken link."""

    def replace(match: re.Match[str]) -> str:
        if "://" in match["src"] or (page_dir / match["src"]).exists():
            return match[0]
        return f"*[{match['alt'] or 'image'}: `{match['src']}`, not part of this repository]*"

    return _IMAGE.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    source = Path(config["docs_dir"]) / page.file.src_path
    if page.file.src_path.startswith("protocols/"):
        markdown = missing_seed_images(markdown, source.parent)
    return expand(markdown)


#: A Sphinx role left in a docstring (``:class:`X```), as the Markdown renders it.
_ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):<code>(~?)([\w.]+)(\(\))?</code>")


def plain_roles(html: str) -> str:
    """``:class:`~a.b.C``` -> ``C``, ``:meth:`x``` -> ``x``: the docstrings are written
    for Sphinx-aware readers and mkdocstrings shows their roles as text."""

    def replace(match: re.Match[str]) -> str:
        name = match[2].rsplit(".", 1)[-1] if match[1] else match[2]
        return f"<code>{name}{match[3] or ''}</code>"

    return _ROLE.sub(replace, html)


def on_page_content(html: str, **_: Any) -> str:
    return plain_roles(html)


def on_pre_build(**_: Any) -> None:
    _CACHE.clear()  # `mkdocs serve`: each build sees the code as it is
    parsed_package.cache_clear()
    package_nodes.cache_clear()
