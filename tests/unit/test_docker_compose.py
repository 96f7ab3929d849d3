"""docker/compose.yaml: valid for Compose, and shaped so that it really starts.

No Docker engine runs here, but ``config`` needs none: the test runs
``docker compose config`` (the CLI plugin) or, where that is missing,
Debian's ``docker-compose config`` (scripts/ensure-compose.sh installs it;
tests/support/compose.py), and checks the rendered file: the image is built
once, every dependency waits for health or for a
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
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.bus.directory import FileDirectory
from pipeline.local.s3 import LocalStore
from tests.support.compose import compose_cli, config, env_of, mounts_of, render

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
ONE_SHOT = {"init", "airflow-init"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    """The file as Compose renders it (anchors merged, defaults applied), else as YAML reads it."""
    return render(COMPOSE)


def test_compose_config_validates() -> None:
    if compose_cli() is None:
        pytest.skip(
            "neither `docker compose` nor `docker-compose` is installed (scripts/ensure-compose.sh)"
        )
    out = config(COMPOSE, {}, "--quiet")
    assert out.returncode == 0, out.stderr


def test_the_sluice_image_is_built_once(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    assert [name for name, service in services.items() if service.get("build")] == ["init"]
    image = services["init"]["image"]
    for name, service in services.items():
        if service.get("image") == image and name != "init":
            assert service.get("pull_policy") == "never", f"{name} would build or pull it again"


def test_every_service_starts_on_what_it_needs(rendered: dict[str, Any]) -> None:
    services: dict[str, Any] = rendered["services"]
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") in ("no", None), name
        else:
            assert service.get("restart") in ("unless-stopped", "always"), (
                f"{name}: no restart policy"
            )
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
        redis_url = env_of(service).get("SLUICE_REDIS_URL")
        if redis_url and name not in ONE_SHOT and name not in ("spark-master", "spark-worker"):
            assert "redis" in depends, f"{name} uses redis without waiting for it"


def test_producer_runs_until_stopped(rendered: dict[str, Any]) -> None:
    command = rendered["services"]["producer"]["command"]
    assert command[command.index("--count") + 1] == "0"
    port = command[command.index("--health-listen") + 1].rsplit(":", 1)[1]
    health = rendered["services"]["producer"]["healthcheck"]["test"]
    assert health[-1] == f"http://127.0.0.1:{port}/healthz"
    assert rendered["services"]["producer"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_bus_gets_generated_key_and_directory(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    bus, init = services["bus"], services["init"]
    env = env_of(bus)
    assert bus["depends_on"]["init"]["condition"] == "service_completed_successfully"
    secrets = {source for source, target in mounts_of(bus) if target == "/run/sluice"}
    assert secrets and secrets == {s for s, t in mounts_of(init) if t == "/run/sluice"}
    assert env["SLUICE_BUS_KEY_FILE"].startswith("/run/sluice/")
    assert env["SLUICE_BUS_DIRECTORY"].startswith("/run/sluice/")
    assert env_of(init)["SLUICE_BUS_TWIN"] == env["SLUICE_BUS_TWIN"]
    assert "SLUICE_BUS_HEALTH_LISTEN" in env and "SLUICE_NODE_HEALTH_LISTEN" in env_of(
        services["node"]
    )


def test_airflow_on_postgres_local_executor_unpaused(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    airflow = [n for n in services if n.startswith("airflow-") and n != "airflow-init"]
    assert {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor"} <= set(airflow)
    secrets = set()
    for name in [*airflow, "airflow-init"]:
        env = env_of(services[name])
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
    assert any(target == "/data" for _, target in mounts_of(s3)), "the store keeps no volume"
    command = s3["command"]
    port = command[command.index("--port") + 1].rsplit(":", 1)[1]
    health = " ".join(s3["healthcheck"]["test"])
    assert command[command.index("--health") + 1] in health and port in health
    server = env_of(s3)
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
        env = env_of(services[name])
        lakes.add(env["SLUICE_LAKE_URI"])
        assert env["SLUICE_LAKE_S3_ENDPOINT"] == f"http://s3:{port}", name
        assert env["SLUICE_LAKE_S3_ALLOW_HTTP"] == "true", name
        assert env["SLUICE_LAKE_S3_ACCESS_KEY"] == server["ROOT_ACCESS_KEY"], name
        assert env["SLUICE_LAKE_S3_SECRET_KEY"] == server["ROOT_SECRET_KEY"], name
        # delta-rs' safe commits (conditional puts), never "last writer wins"
        assert env.get("SLUICE_LAKE_S3_CONDITIONAL_PUT", "etag") == "etag", name
        assert services[name]["depends_on"]["s3"]["condition"] == "service_healthy", name
        assert not any(target == "/lake" for _, target in mounts_of(services[name])), name
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


def test_init_script_writes_the_serve_token_for_prometheus(tmp_path: Path) -> None:
    """docker/compose.production.yaml: Prometheus (another user) reads the token init wrote."""
    scrape = tmp_path / "scrape"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SLUICE_SECRETS_DIR": str(tmp_path / "secrets"),
        "SLUICE_LAKE_URI": str(tmp_path / "lake"),
        "PROMETHEUS_SECRETS_DIR": str(scrape),
        "SLUICE_SERVE_TOKEN": "tok-1",
    }
    script = str(ROOT / "docker" / "init.sh")
    for token in ("tok-1", "tok-2"):  # the environment is the token's source: rewritten
        env["SLUICE_SERVE_TOKEN"] = token
        done = subprocess.run(
            ["sh", script], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert (scrape / "serve_token").read_text() == token
    assert stat.S_IMODE((scrape / "serve_token").stat().st_mode) == 0o644
    assert stat.S_IMODE(scrape.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "secrets" / "twin1.key").stat().st_mode) == 0o600
    del env["SLUICE_SERVE_TOKEN"]
    refused = subprocess.run(
        ["sh", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "init: PROMETHEUS_SECRETS_DIR is set but SLUICE_SERVE_TOKEN is not"
    )
