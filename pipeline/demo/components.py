"""The processes the demo runs, each a supervised Component built from the demo's Plan.

Redis (and the PostgreSQL and S3 servers it needs), Spark Connect, ``sluice
serve``, the producer, two nodes, two bus twins, ``airflow standalone`` and
the subscriber from block 0: each with its command, environment and probe.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from pipeline.demo import metadb
from pipeline.demo.plan import LAKE_BUCKET, STREAM, TWINS, Plan
from pipeline.demo.probes import airflow_probe, http_probe, redis_probe, tcp_probe
from pipeline.demo.procs import MARKER
from pipeline.demo.supervisor import Component
from pipeline.local import postgres as localpostgres
from pipeline.local import s3 as localstore


def sluice(*args: str) -> tuple[str, ...]:
    """``sluice ARGS`` run by this interpreter (no PATH lookup, the same venv)."""
    return (sys.executable, "-m", "pipeline.cli", *args)


def redis_component(plan: Plan) -> Component:
    exe = shutil.which("redis-server") or "redis-server"
    data = plan.dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    return Component(
        name="redis",
        role="Redis (bus queues)" if plan.redis else "Redis (streams, bus queues)",
        argv=(
            exe,
            "--port",
            str(plan.redis_port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--daemonize",
            "no",
            "--proc-title-template",
            f"{{title}} {{listen-addr}} {MARKER}={plan.demo_id}",
        ),
        ready=redis_probe(plan.redis_port),
        ready_timeout_s=15,
        waits_for=f"redis-server to answer PING on port {plan.redis_port}",
        stop_grace_s=5,
    )


def postgres_component(plan: Plan) -> Component:
    """Airflow's metadata database: Debian's PostgreSQL, its cluster made on first use."""
    directory = localpostgres.reachable_dir(plan.postgres_dir)
    if not (directory / "data" / "PG_VERSION").exists():
        localpostgres.init_cluster(directory)
    argv = localpostgres.server_argv(directory / "data", plan.postgres_port, directory)
    user = localpostgres.run_as()
    if user is not None:  # root: PostgreSQL runs as its own user
        argv = ["runuser", "-u", user, "--", *argv]
    return Component(
        name="postgres",
        role="PostgreSQL (Airflow's metadata)",
        argv=tuple(argv),
        ready=tcp_probe(plan.postgres_port),
        ready_timeout_s=60,
        waits_for=f"PostgreSQL to listen on port {plan.postgres_port}",
        stop_grace_s=10,
    )


def store_component(plan: Plan) -> Component:
    """The lake's S3 server (versitygw), its bucket a directory made before it starts."""
    (plan.store_dir / LAKE_BUCKET).mkdir(parents=True, exist_ok=True)
    return Component(
        name="s3",
        role="S3 server holding the lake (versitygw)",
        argv=tuple(
            localstore.server_argv(localstore.binary_path(), plan.store_port, plan.store_dir)
        ),
        env=localstore.server_env(),
        ready=tcp_probe(plan.store_port),
        ready_timeout_s=30,
        waits_for=f"the S3 server to listen on port {plan.store_port}",
        stop_grace_s=5,
    )


def spark_component(plan: Plan) -> Component:
    return Component(
        name="spark",
        role="Spark Connect with Delta (lake jobs)",
        argv=sluice(
            "spark",
            "--port",
            str(plan.spark_port),
            "--master",
            "local[2]",
            "--log-file",
            str(plan.dir / "spark-jvm.log"),
        ),  # fmt: skip
        env=plan.sluice_env(),
        ready=tcp_probe(plan.spark_port),
        ready_timeout_s=240,
        waits_for=f"Spark Connect to listen on port {plan.spark_port}",
        stop_grace_s=20,
    )


def serve_component(plan: Plan) -> Component:
    return Component(
        name="serve",
        role="resumption server + status page",
        argv=sluice("serve", "--port", str(plan.serve_port)),
        env=plan.sluice_env(),
        ready=http_probe(f"http://127.0.0.1:{plan.serve_port}/healthz"),
        ready_timeout_s=60,
        waits_for=f"sluice serve's /healthz on port {plan.serve_port} to answer 200",
    )


def produce_component(plan: Plan) -> Component:
    return Component(
        name="produce",
        role="chain producer with reorgs",
        argv=sluice(
            "produce",
            "--stream",
            STREAM,
            "--rate",
            f"{plan.rate:g}",
            "--count",
            "0",
            "--reorg-every",
            str(plan.reorg_every),
            "--reorg-depth",
            str(plan.reorg_depth),
            "--seed",
            "12",
        ),  # fmt: skip
        env=plan.sluice_env(),
        stop_grace_s=5,
    )


def node_components(plan: Plan) -> list[Component]:
    """Node a asks b's echo over the Redis stream transport; b asks a's echo over Dialogue/TCP."""
    made = []
    for name, listen, health, consume, route in (
        ("a", plan.node_a_port, plan.node_a_health, "node-a", "stream:node-b/node-a,echo"),
        ("b", plan.node_b_port, plan.node_b_health, "node-b", f"tcp:127.0.0.1:{plan.node_a_port},echo"),
    ):  # fmt: skip
        env = {**plan.sluice_env(), "SLUICE_NODE_HEALTH_LISTEN": f"127.0.0.1:{health}"}
        made.append(
            Component(
                name=f"node-{name}",
                role=f"node {name}: echo + requester "
                + ("over streams" if name == "a" else "over Dialogue/TCP"),
                argv=sluice(
                    "node",
                    "--name",
                    f"node-{name}",
                    "--workers",
                    "echo,requester",
                    "--consume",
                    consume,
                    "--listen",
                    f"127.0.0.1:{listen}",
                    "--request-route",
                    route,
                    "--request-count",
                    "1000000",
                    "--request-interval",
                    "1",
                    "--record",
                    str(plan.record(f"node-{name}")),
                ),  # fmt: skip
                env=env,
                ready=http_probe(f"http://127.0.0.1:{health}/healthz"),
                ready_timeout_s=60,
                waits_for=f"the node's /healthz on port {health} to answer 200",
            )
        )
    return made


def write_bus_keys(plan: Plan) -> Path:
    """Ed25519 keys of both twins and their directory under ``<demo>/bus`` (keys 0600)."""
    from pipeline.bus.signing import Signer

    plan.bus_dir.mkdir(parents=True, exist_ok=True)
    plan.bus_dir.chmod(0o700)
    doc = {}
    for i, twin in enumerate(TWINS):
        key = plan.bus_dir / f"twin{twin}.key"
        if not key.exists():
            Signer.generate().write(str(key))
        doc[str(twin)] = {"url": plan.bus_url(i), "key": Signer.from_file(str(key)).public_key}
    directory = plan.bus_dir / "twins.json"
    directory.write_text(json.dumps(doc, indent=2))
    return directory


def bus_components(plan: Plan) -> list[Component]:
    directory = plan.bus_dir / "twins.json"
    made = []
    for i, twin in enumerate(TWINS):
        env = {
            **plan.sluice_env(),
            "SLUICE_BUS_HEALTH_LISTEN": f"127.0.0.1:{plan.bus_health[i]}",
        }
        made.append(
            Component(
                name=f"bus-{twin}",
                role=f"bus twin {twin} (signed bus-to-bus HTTP)",
                argv=sluice(
                    "bus",
                    "--twin",
                    str(twin),
                    "--listen",
                    f"127.0.0.1:{plan.bus_ports[i]}",
                    "--directory",
                    str(directory),
                    "--key",
                    str(plan.bus_dir / f"twin{twin}.key"),
                    "--redis",
                    plan.redis_url(1 + i),
                ),  # fmt: skip
                env=env,
                ready=http_probe(f"http://127.0.0.1:{plan.bus_health[i]}/healthz"),
                ready_timeout_s=60,
                waits_for=f"the bus's /healthz on port {plan.bus_health[i]} to answer 200",
            )
        )
    return made


def airflow_component(plan: Plan) -> Component:
    """``airflow standalone`` on a metadata database made afresh for this demo
    (:mod:`pipeline.demo.metadb` makes it, then runs Airflow in its place)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    return Component(
        name="airflow",
        role="Airflow: sluice_archive every minute",
        argv=(
            sys.executable,
            "-m",
            "pipeline.demo.metadb",
            "--port",
            str(plan.postgres_port),
            "--database",
            metadb.RUN_DATABASE,
            "--",
            airflow,
            "standalone",
        ),  # fmt: skip
        env=plan.airflow_env(),
        ready=airflow_probe(plan),
        ready_timeout_s=300,
        stop_grace_s=20,
        waits_for="Airflow's health API to say the scheduler and the DAG processor are healthy",
    )


def subscriber_component(plan: Plan) -> Component:
    return Component(
        name="subscriber",
        role="sluice subscribe --from 0 (after the trim)",
        argv=sluice("subscribe", "--url", plan.ws_url, "--from", "0"),
        env=plan.sluice_env(),
        stop_grace_s=5,
    )
