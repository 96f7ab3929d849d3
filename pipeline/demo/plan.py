"""Where and how fast the demo runs: one :class:`Plan` of ports, paths, timings and environments.

Everything lives under ``<var>/demo`` (``var/`` is git-ignored: the bus keys
generated there never reach ``git add .``). User-facing ports (the status
page, the Airflow UI, Spark Connect) come from flags and settings; internal
ports (Redis, the nodes, the buses, Airflow's log servers) are picked free.

Redis databases: db 0 holds the chain stream and the nodes' streams; the two
bus twins each get their own database (1 and 2), as two twins on two hosts
would each have their own Redis.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.demo import airflowdb, metadb
from pipeline.local import s3 as localstore
from pipeline.runtime.ports import free_port
from pipeline.settings import LakeSettings

STREAM = "chain:demo"
RPC_CMD = "demo.ping"
TWINS = (1, 2)
#: the bucket of the lake when it is on the demo's S3 server
LAKE_BUCKET = "lake"


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Where and how fast the demo runs (one per ``sluice demo`` invocation)."""

    root: Path  # the checkout with dags/ and plugins/
    dir: Path  # <var>/demo
    redis_port: int
    #: Airflow's metadata database: a private PostgreSQL
    postgres_port: int
    serve_port: int
    airflow_port: int
    spark_port: int
    node_a_port: int
    node_b_port: int
    node_a_health: int
    node_b_health: int
    bus_ports: tuple[int, int]
    bus_health: tuple[int, int]
    log_ports: tuple[int, int]
    #: the marker value every process of this demo carries (see :mod:`pipeline.demo.procs`)
    demo_id: str = ""
    #: blocks per second of the producer; a reorg every ``reorg_every`` steps
    rate: float = 2.0
    reorg_every: int = 12
    reorg_depth: int = 3
    archive_cron: str = "* * * * *"
    #: Entries younger than this stay in Redis after they are archived.
    hot_retention_s: int = 30
    airflow_parallelism: int = 3
    #: "local" (a directory) or "s3" (a versitygw the demo runs on ``store_port``)
    lake: str = "local"
    store_port: int = 0
    #: the user's Redis for everything but the bus twins (``sluice demo --redis``); empty:
    #: the demo's own
    redis: str = ""
    #: the user's Spark Connect server (``sluice demo --spark``); empty: the demo's own on
    #: ``spark_port``
    spark: str = ""

    @classmethod
    def make(
        cls, root: Path, demo_dir: Path, *, serve_port: int, airflow_port: int, spark_port: int,
        **timing: float | int | str,
    ) -> Plan:  # fmt: skip
        return cls(
            root=root,
            dir=demo_dir,
            redis_port=free_port(),
            postgres_port=free_port(),
            serve_port=serve_port,
            airflow_port=airflow_port,
            spark_port=spark_port,
            node_a_port=free_port(),
            node_b_port=free_port(),
            node_a_health=free_port(),
            node_b_health=free_port(),
            bus_ports=(free_port(), free_port()),
            bus_health=(free_port(), free_port()),
            log_ports=(free_port(), free_port()),
            store_port=free_port(),
            **timing,  # type: ignore[arg-type]
        )

    # --- addresses ------------------------------------------------------------

    @property
    def postgres_dir(self) -> Path:
        """The PostgreSQL cluster, kept with Airflow's home (its migrated template database)."""
        return self.airflow_home / "postgres"

    @property
    def airflow_db_url(self) -> str:
        """Airflow's metadata database: made afresh by each demo (:mod:`pipeline.demo.metadb`)."""
        return metadb.database_url(self.postgres_port, metadb.RUN_DATABASE)

    def redis_url(self, db: int = 0) -> str:
        """Database 0: streams, chain, nodes, lake jobs, Airflow (the user's Redis when
        given); 1 and 2: the bus twins, always on the demo's own Redis."""
        if db == 0 and self.redis:
            return self.redis
        return f"redis://127.0.0.1:{self.redis_port}/{db}"

    @property
    def lake_uri(self) -> str:
        return f"s3://{LAKE_BUCKET}/sluice" if self.lake == "s3" else str(self.dir / "lake")

    @property
    def store_dir(self) -> Path:
        """The S3 server's root: each subdirectory is a bucket."""
        return self.dir / "s3"

    def lake_settings(self) -> LakeSettings:
        """The lake as every component reads it (the S3 server's address when on S3)."""
        if self.lake != "s3":
            return LakeSettings.from_url(self.lake_uri)
        s3 = {
            k.removeprefix("lake_"): v for k, v in localstore.lake_settings(self.store_port).items()
        }
        return LakeSettings(uri=self.lake_uri, **s3)  # type: ignore[arg-type]

    def lake_env(self) -> dict[str, str]:
        """``SLUICE_LAKE_*`` for the lake: its URI, and the S3 server's address when on S3."""
        env = {"SLUICE_LAKE_URI": self.lake_uri}
        if self.lake == "s3":
            for key, value in localstore.lake_settings(self.store_port).items():
                env[f"SLUICE_{key.upper()}"] = str(value).lower() if value is True else str(value)
        return env

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_port}/"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.serve_port}/ws"

    @property
    def airflow_url(self) -> str:
        return f"http://127.0.0.1:{self.airflow_port}"

    @property
    def spark_url(self) -> str:
        return self.spark or f"sc://127.0.0.1:{self.spark_port}"

    @property
    def airflow_home(self) -> Path:
        return self.dir / "airflow"

    @property
    def bus_dir(self) -> Path:
        return self.dir / "bus"

    def record(self, node: str) -> Path:
        """The file a node's requester appends one line per reply to."""
        return self.dir / f"{node}.replies"

    def bus_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.bus_ports[i]}"

    # --- environment ------------------------------------------------------------

    def sluice_env(self) -> dict[str, str]:
        """``SLUICE_*`` every Sluice child shares."""
        return {
            "SLUICE_REDIS_URL": self.redis_url(),
            **self.lake_env(),
            "SLUICE_VAR_DIR": str(self.dir),
            "SLUICE_STREAMS": STREAM,
            "SLUICE_CHAIN_STREAMS": STREAM,
            "SLUICE_SERVE_STREAM": STREAM,
            "SLUICE_SERVE_HOST": "127.0.0.1",
            "SLUICE_SERVE_PORT": str(self.serve_port),
            "SLUICE_ARCHIVE_CRON": self.archive_cron,
            "SLUICE_HOT_RETENTION_S": str(self.hot_retention_s),
            "SLUICE_SPARK_REMOTE": self.spark_url,
            "SLUICE_SPARK_CONNECT_PORT": str(self.spark_port),
            "SLUICE_SPARK_MASTER": "local[2]",
            "SLUICE_LAKE_TASK_RETRIES": "1",
            "SLUICE_LOG_LEVEL": "INFO",
        }

    def airflow_env(self) -> dict[str, str]:
        """Airflow 3 as ``airflow standalone`` needs it on a small machine.

        Parallelism 32 (the default) starts 32 idle workers; a non-default API
        port needs the base URL too; the worker and trigger log servers bind
        8793/8794 unless told otherwise; ``standalone`` runs its parts as
        ``airflow ...`` from PATH, so the venv's bin/ goes first.
        """
        home = self.airflow_home
        bin_dir = str(Path(sys.executable).parent)
        import os

        return {
            **self.sluice_env(),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.root / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.root / "plugins"),
            **airflowdb.database_env(self.airflow_db_url),
            "AIRFLOW__CORE__PARALLELISM": str(self.airflow_parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.airflow_port),
            "AIRFLOW__API__BASE_URL": self.airflow_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_ports[0]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.log_ports[1]),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        }

    def admin_password(self) -> str | None:
        """The password ``airflow standalone`` generated for ``admin`` (None until it did)."""
        path = self.airflow_home / "simple_auth_manager_passwords.json.generated"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        value = doc.get("admin") if isinstance(doc, dict) else None
        return value if isinstance(value, str) else None


__all__ = ["LAKE_BUCKET", "RPC_CMD", "STREAM", "TWINS", "Plan"]
