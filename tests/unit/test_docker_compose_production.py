"""docker/compose.production.yaml: valid for Compose, and the production shape it claims.

Rendered by ``compose config`` (tests/support/compose.py) with test credentials,
and checked: it refuses to render without each credential (none has a default
in the file); every service starts on what it needs, with a health check; Redis
is a master, two replicas and three Sentinels, and every Sluice process, the bus
included, and Celery's broker reach it through the Sentinels; the servers sit
behind HAProxy (docker/haproxy.cfg) checking their /healthz; Airflow runs on
CeleryExecutor with two workers; Prometheus (docker/prometheus.yml) scrapes
every /metrics the file opens; the Sluice image is built once. The commands
each service runs are checked against the image's packages in
tests/unit/test_docker_images.py, docker/redis-ha.sh against real Redis
servers in tests/integration/ha/test_redis_ha_script.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.compose import (
    DOCKER,
    argv_of,
    compose_cli,
    config,
    env_of,
    mounts_of,
    render,
)

FILE = DOCKER / "compose.production.yaml"
#: The credentials, each from the environment: test values that appear nowhere else.
CREDENTIALS = {
    "SLUICE_REDIS_PASSWORD": "redis-pw-5d1e",
    "SLUICE_POSTGRES_PASSWORD": "pg-pw-77ab",
    "SLUICE_S3_ACCESS_KEY": "s3-access-90c2",
    "SLUICE_S3_SECRET_KEY": "s3-secret-3f4e",
    "SLUICE_SERVE_TOKEN": "serve-token-a1b2",
}
ONE_SHOT = {"init", "airflow-init"}
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
REDIS = ("redis-1", "redis-2", "redis-3")


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    rendered: dict[str, Any] = render(FILE, CREDENTIALS)["services"]
    return rendered


def _needs_cli() -> None:
    if compose_cli() is None:
        pytest.skip("neither `docker compose` nor `docker-compose` (scripts/ensure-compose.sh)")


def test_config_validates_and_refuses_a_missing_credential() -> None:
    _needs_cli()
    done = config(FILE, CREDENTIALS, "--quiet")
    assert done.returncode == 0, done.stderr
    for name in CREDENTIALS:
        without = {k: v for k, v in CREDENTIALS.items() if k != name}
        refused = config(FILE, without, "--quiet")
        assert refused.returncode != 0 and name in refused.stderr, (name, refused.stderr)


def test_no_credential_is_written_in_the_file(services: dict[str, Any]) -> None:
    text = FILE.read_text()
    for name in CREDENTIALS:
        uses = re.findall(r"\$\{" + name + r"([^}]*)\}", text)
        assert uses and all(use.startswith(":?") for use in uses), (name, uses)
    secret = re.compile(r"(PASSWORD|SECRET_KEY|ACCESS_KEY|TOKEN|_AUTH)$")
    for name, service in services.items():
        for key, value in env_of(service).items():
            if secret.search(key):
                assert value in CREDENTIALS.values(), f"{name}: {key} is not from the environment"
            for url_key in ("SQL_ALCHEMY_CONN", "RESULT_BACKEND", "BROKER_URL", "REDIS_URL"):
                if key.endswith(url_key):
                    passwords = {urlsplit(u).password for u in value.split(";")}
                    assert passwords <= set(CREDENTIALS.values()), f"{name}: {key}"


def test_every_service_starts_on_what_it_needs(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") in ("no", None), name
        else:
            assert service.get("restart") in ("unless-stopped", "always"), name
            assert service.get("healthcheck", {}).get("test"), f"{name}: no health check"
        for target, cond in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on unknown {target}"
            if cond["condition"] == "service_healthy":
                assert services[target].get("healthcheck"), f"{name} waits for {target}'s health"
            else:
                assert cond["condition"] == "service_completed_successfully", (name, target)
                assert target in ONE_SHOT, (name, target)


def test_the_sluice_image_is_built_once(services: dict[str, Any]) -> None:
    built = [name for name, service in services.items() if service.get("build")]
    assert built == ["init"]
    image = services["init"]["image"]
    runs = [name for name, s in services.items() if s.get("image") == image and name != "init"]
    assert len(runs) > 10
    for name in runs:
        assert services[name].get("pull_policy") == "never", name


def test_redis_is_a_master_two_replicas_and_three_sentinels(services: dict[str, Any]) -> None:
    for name in REDIS:
        assert argv_of(services[name], "entrypoint")[-2:] == [
            "/usr/local/bin/redis-ha.sh",
            "server",
        ]
    for name in SENTINELS:
        assert argv_of(services[name], "entrypoint")[-2:] == [
            "/usr/local/bin/redis-ha.sh",
            "sentinel",
        ]
    for name in (*REDIS, *SENTINELS):  # each keeps its own data and config
        [(volume, _)] = [m for m in mounts_of(services[name]) if m[1] == "/data"]
        assert volume == name, name
        assert services[name]["hostname"] == name
    health = " ".join(services["sentinel-1"]["healthcheck"]["test"])
    assert "ckquorum sluice" in health


def test_every_redis_user_goes_through_the_sentinels(services: dict[str, Any]) -> None:
    users = {
        n: env_of(s)["SLUICE_REDIS_URL"]
        for n, s in services.items()
        if "SLUICE_REDIS_URL" in env_of(s)
    }
    assert {"bus", "node", "producer", "serve-1", "serve-2", "airflow-worker-1"} <= set(users)
    for name, url in users.items():
        parts = urlsplit(url)
        assert parts.scheme == "redis+sentinel", name
        hosts = {h.rsplit(":", 1)[0] for h in parts.netloc.rpartition("@")[2].split(",")}
        assert hosts == set(SENTINELS) and parts.path.split("/")[1] == "sluice", name
        if name not in ONE_SHOT and not name.startswith("spark-"):
            for sentinel in SENTINELS:
                assert services[name]["depends_on"][sentinel]["condition"] == "service_healthy"
    min_replicas = int(env_of(services["bus"])["SLUICE_REDIS_MIN_REPLICAS"])
    assert len(REDIS) - 1 >= min_replicas + 1  # a replica may die and writes go on
    broker = env_of(services["airflow-worker-1"])
    urls = broker["AIRFLOW__CELERY__BROKER_URL"].split(";")
    assert {urlsplit(u).scheme for u in urls} == {"sentinel"}
    assert {urlsplit(u).hostname for u in urls} == set(SENTINELS)
    assert broker["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__MASTER_NAME"] == "sluice"


def _haproxy() -> dict[str, list[str]]:
    """docker/haproxy.cfg: each section's header -> its lines."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in (DOCKER / "haproxy.cfg").read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not line.startswith((" ", "\t")):
            current = sections.setdefault(line.strip(), [])
        else:
            current.append(" ".join(line.split()))
    return sections


def test_the_servers_sit_behind_a_balancer_checking_their_health(
    services: dict[str, Any],
) -> None:
    serves = sorted(n for n, s in services.items() if argv_of(s, "command")[:1] == ["serve"])
    assert len(serves) >= 2
    backend = _haproxy()["backend serve"]
    servers = {line.split()[1]: line.split()[2] for line in backend if line.startswith("server ")}
    for name in serves:
        command = argv_of(services[name], "command")
        assert servers.pop(name) == f"{name}:{command[command.index('--port') + 1]}"
        assert not services[name].get("ports"), f"{name} is reached through the balancer only"
    assert servers == {}
    assert "option httpchk GET /healthz" in backend
    assert "http-check expect status 200" in backend
    assert any(line.startswith("default-server check ") for line in backend)
    lb = services["lb"]
    assert {(m[0].rsplit("/", 1)[-1], m[1]) for m in mounts_of(lb)} == {
        ("haproxy.cfg", "/usr/local/etc/haproxy/haproxy.cfg")
    }
    frontend = _haproxy()["frontend serve"]
    [monitor] = [line.split()[1] for line in frontend if line.startswith("monitor-uri ")]
    assert lb["healthcheck"]["test"][-1].endswith(f":8765{monitor}")
    assert "bind :8765" in frontend
    assert _published(lb) == {("8765", "8765")}


def _published(service: dict[str, Any]) -> set[tuple[str, str]]:
    """``(host port, container port)`` of each published port, in either rendering."""
    out = set()
    for port in service.get("ports") or ():
        if isinstance(port, dict):
            out.add((str(port["published"]), str(port["target"])))
        else:
            published, _, target = str(port).rpartition(":")
            out.add((published, target))
    return out


def test_airflow_runs_on_celery_with_two_workers(services: dict[str, Any]) -> None:
    airflow = [n for n, s in services.items() if argv_of(s, "entrypoint") == ["airflow"]]
    assert len(airflow) >= 7
    jwt = set()
    for name in airflow:
        env = env_of(services[name])
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://"), name
        jwt.add(env["AIRFLOW__API_AUTH__JWT_SECRET_CMD"])
    assert len(jwt) == 1
    workers = [n for n in airflow if argv_of(services[n], "command")[:2] == ["celery", "worker"]]
    assert len(workers) == 2
    assert len({services[n]["hostname"] for n in workers}) == 2  # logs are fetched by host name
    for name in workers:
        assert "inspect ping" in " ".join(services[name]["healthcheck"]["test"])


def _listen_port(value: str) -> str:
    return value.rsplit(":", 1)[1]


def _metrics_endpoints(services: dict[str, Any]) -> set[str]:
    """``host:port`` of every /metrics the file opens (Sluice's processes, HAProxy, Flower,
    Spark's master and workers)."""
    found = set()
    for name, service in services.items():
        env, command = env_of(service), argv_of(service, "command")
        entry = argv_of(service, "entrypoint")
        if command[:1] == ["serve"]:
            found.add(f"{name}:{command[command.index('--port') + 1]}")
        if "--health-listen" in command:
            found.add(f"{name}:{_listen_port(command[command.index('--health-listen') + 1])}")
        for key in ("SLUICE_NODE_HEALTH_LISTEN", "SLUICE_BUS_HEALTH_LISTEN"):
            if key in env:
                found.add(f"{name}:{_listen_port(env[key])}")
        if command[:2] == ["celery", "flower"]:
            found.add(f"{name}:{command[command.index('--port') + 1]}")
        if entry[1:2] == ["org.apache.spark.deploy.master.Master"]:
            found.add(f"{name}:8080")
        if entry[1:2] == ["org.apache.spark.deploy.worker.Worker"]:
            found.add(f"{name}:8081")
    [metrics] = [line for line in _haproxy()["frontend metrics"] if line.startswith("bind ")]
    found.add(f"lb:{_listen_port(metrics.split()[1])}")
    return found


def test_prometheus_scrapes_every_metrics_endpoint(services: dict[str, Any]) -> None:
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"]
    targets = {
        target
        for job in scrape
        if job["job_name"] != "prometheus"
        for group in job["static_configs"]
        for target in group["targets"]
    }
    assert targets == _metrics_endpoints(services)
    for name in services["prometheus"].get("depends_on", {}):
        assert name in services
    # the serve token: a file init writes from SLUICE_SERVE_TOKEN, on a volume both mount
    [serve_job] = [job for job in scrape if job["job_name"] == "sluice-serve"]
    token_file = Path(serve_job["authorization"]["credentials_file"])
    init = services["init"]
    assert env_of(init)["PROMETHEUS_SECRETS_DIR"] == str(token_file.parent)
    assert env_of(init)["SLUICE_SERVE_TOKEN"] == CREDENTIALS["SLUICE_SERVE_TOKEN"]
    shared = {v for v, t in mounts_of(init) if t == str(token_file.parent)}
    assert shared and shared == {
        v for v, t in mounts_of(services["prometheus"]) if t == str(token_file.parent)
    }
    for name in ("serve-1", "serve-2"):
        assert env_of(services[name])["SLUICE_SERVE_TOKEN"] == CREDENTIALS["SLUICE_SERVE_TOKEN"]
    assert services["prometheus"]["depends_on"]["init"]["condition"] == (
        "service_completed_successfully"
    )


def test_the_producer_has_a_health_check_on_its_listener(services: dict[str, Any]) -> None:
    producer = services["producer"]
    command = argv_of(producer, "command")
    assert command[command.index("--count") + 1] == "0"
    port = _listen_port(command[command.index("--health-listen") + 1])
    assert producer["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port}/healthz"


def test_mounted_files_exist(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for source, _ in mounts_of(service):
            if "/" in source or source.startswith("."):  # a bind mount, not a named volume
                assert (DOCKER / Path(source).name).is_file(), f"{name} mounts missing {source}"


def test_haproxy_accepts_its_config(tmp_path: Path) -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("no haproxy here to check docker/haproxy.cfg with (apt-get install haproxy)")
    done = subprocess.run(
        [haproxy, "-c", "-f", str(DOCKER / "haproxy.cfg")],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
