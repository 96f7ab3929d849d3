"""docker/compose.yaml: valid for Compose, and shaped so that it really starts.

No Docker engine runs here, but ``config`` needs none: the test runs
``docker compose config`` (the CLI plugin) or, where that is missing,
Debian's ``docker-compose config`` (scripts/ensure-compose.sh installs it),
and checks the rendered file: every dependency waits for health or for a
one-shot's success, every long-running service restarts and has a health
check, the bus gets a generated key and directory, Airflow runs on Postgres
with LocalExecutor and unpaused DAGs, the lake is on the S3 service and every
lake user reaches it the same way. Without any
Compose the structural checks still run on the file itself and the validation
is skipped with that reason. Also runs docker/init.sh for real, twice, and once
against the session's S3 server (versitygw), where it creates the lake's bucket.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.bus.directory import FileDirectory
from pipeline.local.s3 import LocalStore

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
ONE_SHOT = {"init", "airflow-init"}
#: Long-running services without a port to probe.
NO_PROBE = {"producer"}


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    """The file as Compose renders it (anchors merged, defaults applied), else as YAML reads it."""
    cli = _compose_cli()
    if cli is None:
        doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
        return doc
    out = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}, check=False,
    )  # fmt: skip
    assert out.returncode == 0, f"{' '.join(cli)} config failed:\n{out.stderr}"
    rendered_doc: dict[str, Any] = yaml.safe_load(out.stdout)
    return rendered_doc


def test_compose_config_validates() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip(
            "neither `docker compose` nor `docker-compose` is installed (scripts/ensure-compose.sh)"
        )
    out = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(service: dict[str, Any]) -> set[tuple[str, str]]:
    out = set()
    for volume in service.get("volumes") or ():
        if isinstance(volume, str):
            source, _, target = volume.partition(":")
            out.add((source, target.split(":")[0]))
        else:
            out.add((volume.get("source", ""), volume["target"]))
    return out


def test_every_service_starts_on_what_it_needs(rendered: dict[str, Any]) -> None:
    services: dict[str, Any] = rendered["services"]
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") in ("no", None), name
        else:
            assert service.get("restart") in ("unless-stopped", "always"), (
                f"{name}: no restart policy"
            )
            if name not in NO_PROBE:
                assert service.get("healthcheck", {}).get("test"), f"{name}: no health check"
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on without conditions"
        for target, cond in depends.items():
            assert target in services, f"{name} depends on unknown {target}"
            condition = cond["condition"]
            if condition == "service_healthy":
                assert services[target].get("healthcheck"), f"{name} waits for {target}'s health"
            else:
                assert condition == "service_completed_successfully" and target in ONE_SHOT, (
                    f"{name} -> {target}: {condition}"
                )
        redis_url = _env(service).get("SLUICE_REDIS_URL")
        if redis_url and name not in ONE_SHOT and name not in ("spark-master", "spark-worker"):
            assert "redis" in depends, f"{name} uses redis without waiting for it"


def test_producer_runs_until_stopped(rendered: dict[str, Any]) -> None:
    command = rendered["services"]["producer"]["command"]
    assert command[command.index("--count") + 1] == "0"
    assert rendered["services"]["producer"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_bus_gets_generated_key_and_directory(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    bus, init = services["bus"], services["init"]
    env = _env(bus)
    assert bus["depends_on"]["init"]["condition"] == "service_completed_successfully"
    secrets = {source for source, target in _mounts(bus) if target == "/run/sluice"}
    assert secrets and secrets == {s for s, t in _mounts(init) if t == "/run/sluice"}
    assert env["SLUICE_BUS_KEY_FILE"].startswith("/run/sluice/")
    assert env["SLUICE_BUS_DIRECTORY"].startswith("/run/sluice/")
    assert _env(init)["SLUICE_BUS_TWIN"] == env["SLUICE_BUS_TWIN"]
    assert "SLUICE_BUS_HEALTH_LISTEN" in env and "SLUICE_NODE_HEALTH_LISTEN" in _env(
        services["node"]
    )


def test_airflow_on_postgres_local_executor_unpaused(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    airflow = [n for n in services if n.startswith("airflow-") and n != "airflow-init"]
    assert {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor"} <= set(airflow)
    secrets = set()
    for name in [*airflow, "airflow-init"]:
        env = _env(services[name])
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://"), name
        assert env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"].lower() == "false", name
        secrets.add(env["AIRFLOW__API_AUTH__JWT_SECRET_CMD"])
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert len(secrets) == 1, "every Airflow component must share one JWT secret"
    for name in airflow:
        assert services[name]["depends_on"]["airflow-init"]["condition"] == (
            "service_completed_successfully"
        )
    assert services["airflow-init"]["command"] == ["db", "migrate"]


def test_lake_on_the_s3_service_reached_alike_by_every_user(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    s3 = services["s3"]
    assert s3["image"].startswith("versity/versitygw:"), s3["image"]
    assert any(target == "/data" for _, target in _mounts(s3)), "the store keeps no volume"
    command = s3["command"]
    port = command[command.index("--port") + 1].rsplit(":", 1)[1]
    health = " ".join(s3["healthcheck"]["test"])
    assert command[command.index("--health") + 1] in health and port in health
    server = _env(s3)
    users = [
        "init",
        "spark-connect",
        "airflow-scheduler",
        "airflow-apiserver",
        "serve-a",
        "serve-b",
    ]
    lakes = set()
    for name in users:
        env = _env(services[name])
        lakes.add(env["SLUICE_LAKE_URI"])
        assert env["SLUICE_LAKE_S3_ENDPOINT"] == f"http://s3:{port}", name
        assert env["SLUICE_LAKE_S3_ALLOW_HTTP"] == "true", name
        assert env["SLUICE_LAKE_S3_ACCESS_KEY"] == server["ROOT_ACCESS_KEY"], name
        assert env["SLUICE_LAKE_S3_SECRET_KEY"] == server["ROOT_SECRET_KEY"], name
        # delta-rs' safe commits (conditional puts), never "last writer wins"
        assert env.get("SLUICE_LAKE_S3_CONDITIONAL_PUT", "etag") == "etag", name
        assert services[name]["depends_on"]["s3"]["condition"] == "service_healthy", name
        assert not any(target == "/lake" for _, target in _mounts(services[name])), name
    assert len(lakes) == 1 and lakes.pop().startswith("s3://")


def test_dockerignore_keeps_the_context_small_and_keys_out() -> None:
    lines = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", "var", "bench-results", ".git", "*.key"} <= lines


def test_dockerfile_copies_files_that_exist() -> None:
    for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"


def test_init_script_generates_key_and_directory_idempotently(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SLUICE_SECRETS_DIR": str(secrets),
        "SLUICE_LAKE_URI": str(tmp_path / "lake"),
        "SLUICE_BUS_TWIN": "3",
        "SLUICE_BUS_URL": "http://bus:8051",
    }
    script = ROOT / "docker" / "init.sh"
    first = subprocess.run(
        ["sh", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert first.returncode == 0, first.stderr
    key = secrets / "twin3.key"
    before = key.read_bytes(), (secrets / "airflow_jwt_secret").read_text()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    second = subprocess.run(
        ["sh", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert second.returncode == 0, second.stderr
    assert (key.read_bytes(), (secrets / "airflow_jwt_secret").read_text()) == before
    directory = FileDirectory.load(secrets / "twins.json")
    doc = json.loads((secrets / "twins.json").read_text())
    assert doc["3"]["url"] == "http://bus:8051" and doc["3"]["key"]
    assert directory.peers[3].url == "http://bus:8051" and (tmp_path / "lake").is_dir()


def test_init_script_creates_the_lake_bucket_on_s3(tmp_path: Path, s3_store: LocalStore) -> None:
    import pyarrow.fs as pafs

    bucket = "init-" + tmp_path.name.lower().replace("_", "-")[-20:]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SLUICE_SECRETS_DIR": str(tmp_path / "secrets"),
        "SLUICE_LAKE_URI": f"s3://{bucket}/sluice",
        **{
            "SLUICE_" + k.upper(): str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in s3_store.lake_settings().items()
        },
    }
    script = ROOT / "docker" / "init.sh"
    for _ in range(2):  # idempotent: the second run finds the bucket
        done = subprocess.run(
            ["sh", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
    fs = pafs.S3FileSystem(
        access_key=env["SLUICE_LAKE_S3_ACCESS_KEY"],
        secret_key=env["SLUICE_LAKE_S3_SECRET_KEY"],
        endpoint_override=s3_store.endpoint.removeprefix("http://"),
        scheme="http",
    )
    assert fs.get_file_info(bucket).type == pafs.FileType.Directory
