"""One Spark Connect server per pytest process, for every test that needs it.

``shared_server(request)`` starts ``sluice spark``'s server (``local[2]``, a
small heap) the first time a test asks and stops it, JVM and Python workers,
when the test session ends (``config.add_cleanup``). Both the lake and the
Airflow conftests expose it as the ``spark_remote`` fixture, so the start-up
cost is paid once per run whichever directory asks first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.lake.spark.server import ConnectServer
from pipeline.runtime.ports import free_port
from pipeline.settings import Settings

_KEY = pytest.StashKey[ConnectServer]()


def server_settings() -> Settings:
    return Settings.load(
        config_path=os.devnull,
        spark_master="local[2]",
        spark_shuffle_partitions=2,
        spark_driver_memory="1g",
        spark_remote="",
    )


def shared_server(request: pytest.FixtureRequest, tmp: Path) -> ConnectServer:
    config: Any = request.config
    server = config.stash.get(_KEY, None)
    if server is not None and server.alive():
        return server
    server = ConnectServer(
        server_settings(), port=free_port(), log_path=tmp / "spark-connect.log"
    ).start()
    config.stash[_KEY] = server
    config.add_cleanup(server.stop)
    return server
