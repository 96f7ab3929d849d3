"""The environment a user's shell would give a ``sluice`` command in a test."""

from __future__ import annotations

import os


def user_env(*, keep_sluice: bool = False) -> dict[str, str]:
    """``os.environ`` without asyncio's debug mode (``make test`` sets it; under load a
    command then logs "Executing <Task ...> took 0.1 seconds", a line no user sees) and,
    unless ``keep_sluice``, without the session's ``SLUICE_*`` variables."""
    return {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONASYNCIODEBUG" and (keep_sluice or not k.startswith("SLUICE_"))
    }
