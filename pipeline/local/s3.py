"""A private S3-compatible server (versitygw) serving a local directory: tests and the demo.

versitygw (Versity S3 Gateway, Apache-2.0) is a real S3 server: it answers
the S3 API over HTTP, with signatures and conditional puts, and stores each
bucket as a directory (its ``posix`` backend). It is a Go program built once
from the Go module proxy into a cache keyed by version
(``~/.cache/sluice-versitygw/<version>/versitygw``, :func:`ensure_binary`;
``make install`` runs ``scripts/ensure-versitygw.sh``, which does the same).

Nothing here fakes S3: :class:`LocalStore` runs the real server as a child
process on a free loopback port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.local.proc import LocalProcess
from pipeline.runtime.ports import free_port

VERSION = "v1.8.0"
MODULE = "github.com/versity/versitygw/cmd/versitygw"
#: The root credentials of a private store (it listens on loopback only).
ACCESS_KEY = "sluice"
SECRET_KEY = "sluice-secret"
REGION = "us-east-1"


def cache_dir(version: str = VERSION) -> Path:
    """Where the binary of ``version`` is cached (``$SLUICE_VERSITYGW_CACHE`` or ~/.cache)."""
    root = os.environ.get("SLUICE_VERSITYGW_CACHE") or str(
        Path.home() / ".cache" / "sluice-versitygw"
    )
    return Path(root) / version


def binary_path(version: str = VERSION) -> Path:
    """Where the versitygw binary of ``version`` is (or will be) cached."""
    return cache_dir(version) / "versitygw"


def server_argv(exe: Path, port: int, directory: Path) -> list[str]:
    """versitygw serving ``directory`` (each subdirectory a bucket) on a loopback port."""
    return [str(exe), "--port", f"127.0.0.1:{port}", "posix", str(directory)]


def server_env() -> dict[str, str]:
    """The root credentials the server takes from its environment."""
    return {"ROOT_ACCESS_KEY": ACCESS_KEY, "ROOT_SECRET_KEY": SECRET_KEY}


def lake_settings(port: int) -> dict[str, object]:
    """The flat ``lake_s3_*`` settings that point a lake at the server on ``port``."""
    return {
        "lake_s3_endpoint": f"http://127.0.0.1:{port}",
        "lake_s3_region": REGION,
        "lake_s3_access_key": ACCESS_KEY,
        "lake_s3_secret_key": SECRET_KEY,
        "lake_s3_allow_http": True,
        "lake_s3_path_style": True,
    }


def ensure_binary(version: str = VERSION) -> Path:
    """The versitygw binary of ``version``, built with ``go install`` when not cached yet.

    The first build compiles for about 15 minutes on 2 busy cores; a line on
    stderr says so. Raises :class:`ConfigError` when it is missing and there is no ``go``.
    """
    target = binary_path(version)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    go = shutil.which("go")
    if go is None:
        raise ConfigError(
            f"versitygw {version} is not in {target.parent} and there is no Go toolchain to "
            f"build it: install Go, or run `GOBIN={target.parent} go install {MODULE}@{version}`"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    print(  # noqa: T201 - a long silent step says what it does
        f"sluice: building versitygw {version} into {target.parent} (once; ~15 min of compiling)",
        file=sys.stderr,
        flush=True,
    )
    subprocess.run(
        [go, "install", f"{MODULE}@{version}"],
        check=True,
        env={**os.environ, "GOBIN": str(target.parent)},
    )
    return target


class LocalStore(LocalProcess):
    """One versitygw child process serving ``directory`` on a free loopback port.

    Buckets are subdirectories of ``directory``; :meth:`create_bucket` makes one
    through the S3 API.
    """

    def __init__(self, directory: Path, *, port: int | None = None) -> None:
        self.directory = Path(directory)
        self.port = port or free_port()
        super().__init__()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lake_settings(self) -> dict[str, object]:
        """The flat ``lake_s3_*`` settings that point a lake at this store."""
        return lake_settings(self.port)

    def start(self, timeout: float = 30.0) -> LocalStore:
        exe = ensure_binary()
        self.directory.mkdir(parents=True, exist_ok=True)
        log = (self.directory.parent / f"versitygw-{self.port}.log").open("ab")
        env = {**os.environ, **server_env()}
        self.proc = subprocess.Popen(
            server_argv(exe, self.port, self.directory),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"versitygw exited with {self.proc.returncode}; see {log.name}")
            if self.listening():
                return self
            time.sleep(0.05)
        self.stop()
        raise ConfigError(f"versitygw on port {self.port} did not listen in {timeout}s")

    def listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def create_bucket(self, name: str) -> None:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            allow_bucket_creation=True,
        )
        fs.create_dir(name)
