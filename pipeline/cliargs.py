"""What every subcommand's parser shares: argument types and help text from docstrings.

Below the CLI dispatcher (:mod:`pipeline.cli`): a part's ``cli`` module imports
this, never the dispatcher.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

__all__ = ["non_negative", "plain"]

_N = TypeVar("_N", int, float)

#: ``:role:`~a.b.Name``` or ``:role:`text``` (Sphinx cross-references).
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def non_negative(kind: Callable[[str], _N]) -> Callable[[str], _N]:
    """An argparse ``type``: ``kind(text)``, refusing negative and non-finite numbers (exit 2)."""

    def parse(text: str) -> _N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"must be a non-negative number, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def plain(doc: str | None) -> str:
    """A module docstring as help text: no reST markup (``x``, :class:`~a.b.C`, ``::``)."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], doc or "")
    text = text.replace("``", "")
    return re.sub(r"::$", ":", text, flags=re.M).strip()
