"""The lifecycle shared by the private servers Sluice starts as child processes
(``redis-server``, versitygw, PostgreSQL): stop, kill, restart and ``with``."""

from __future__ import annotations

import signal
import subprocess
from typing import Self


class LocalProcess:
    """A child server process; subclasses define :meth:`start`.

    ``stop_signal`` is the signal of a graceful stop, ``stop_wait_s`` how long it may
    take before SIGKILL.
    """

    stop_signal: int = signal.SIGTERM
    stop_wait_s: float = 10.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        """Graceful stop, waiting for exit; safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> Self:
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
