"""Child processes that get SIGTERM when the process that started them dies (Linux).

The kernel's ``PR_SET_PDEATHSIG`` must be set in the child, between fork and
exec. ``subprocess``'s ``preexec_fn`` can do that, but it runs Python in a
forked copy of a process that may have threads (an asyncio loop's executor,
a logging handler), where a lock another thread held at the fork is never
released. So the child runs a small Python launcher instead: it sets the
signal, checks that its parent is still the starter (it may have died before
the signal was armed), then replaces itself with the command (same pid).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["bound_to_parent"]

_BOOT = """\
import contextlib, ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit("sluice: the process that started this one is gone")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def bound_to_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when this process dies (same pid, same exit)."""
    return [sys.executable, "-c", _BOOT, str(os.getpid()), *argv]
