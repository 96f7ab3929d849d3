"""The demo's plan puts the lake where --lake says and the lake jobs on the Spark Connect
server --spark names, for every component alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.demo import app, options
from pipeline.demo import components as comp
from pipeline.demo.check import LIVE_S
from pipeline.demo.plan import LAKE_BUCKET, Plan


def plan(tmp_path: Path, lake: str) -> Plan:
    return Plan.make(
        tmp_path, tmp_path / "demo", serve_port=1, airflow_port=2, spark_port=3, lake=lake
    )


def test_a_local_lake_is_a_directory_with_no_s3_settings(tmp_path: Path) -> None:
    p = plan(tmp_path, "local")
    env = p.sluice_env()
    assert env["SLUICE_LAKE_URI"] == str(tmp_path / "demo" / "lake")
    assert not [k for k in env if k.startswith("SLUICE_LAKE_S3_")]
    assert not p.lake_settings().remote


def test_an_s3_lake_points_every_component_at_the_demos_server(tmp_path: Path) -> None:
    p = plan(tmp_path, "s3")
    env = p.sluice_env()
    assert env["SLUICE_LAKE_URI"] == "s3://lake/sluice"
    assert env["SLUICE_LAKE_S3_ENDPOINT"] == f"http://127.0.0.1:{p.store_port}"
    assert env["SLUICE_LAKE_S3_ALLOW_HTTP"] == "true"
    assert p.airflow_env()["SLUICE_LAKE_S3_ENDPOINT"] == env["SLUICE_LAKE_S3_ENDPOINT"]
    lake = p.lake_settings()  # what the check reads the lake with
    assert lake.remote and lake.s3_endpoint == env["SLUICE_LAKE_S3_ENDPOINT"]
    store = comp.store_component(p)
    assert (p.store_dir / LAKE_BUCKET).is_dir()  # the bucket, made before it starts
    assert f"127.0.0.1:{p.store_port}" in store.argv and "ROOT_ACCESS_KEY" in store.env


def test_the_users_spark_stands_in_for_the_demos_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_VAR_DIR", str(tmp_path / "var"))
    opts = options.parse(["--check", "--spark", "sc://127.0.0.1:15002"])
    assert "spark" not in opts.only and "airflow" in opts.only
    p = app.plan_for(opts, tmp_path)
    assert p.sluice_env()["SLUICE_SPARK_REMOTE"] == "sc://127.0.0.1:15002"
    assert p.airflow_env()["SLUICE_SPARK_REMOTE"] == "sc://127.0.0.1:15002"
    assert all(port != opts.spark_port for port, _ in app.user_ports(opts))
    # by default the demo starts its own, and the check follows the live chain 15 s
    default = options.parse(["--check"])
    assert default.only == options.ALL and default.follow_s == LIVE_S == 15.0
    assert app.plan_for(default, tmp_path).sluice_env()["SLUICE_SPARK_REMOTE"] == (
        f"sc://127.0.0.1:{default.spark_port}"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--spark", "http://127.0.0.1:15002"],
        ["--spark", "sc://"],
        ["--spark", "sc://127.0.0.1:port"],
        ["--check", "--follow", "0"],
        ["--start-timeout", "5"],
    ],
)
def test_a_bad_spark_url_follow_or_start_time_exits_2(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLUICE_VAR_DIR", str(tmp_path / "var"))
    with pytest.raises(SystemExit) as exc:
        options.parse(argv)
    assert exc.value.code == 2
    flag = next(a for a in argv if a in ("--spark", "--follow", "--start-timeout"))
    assert flag in capsys.readouterr().err.splitlines()[-1]


def test_airflow_starts_on_the_database_made_afresh_for_this_demo(tmp_path: Path) -> None:
    """Issue 33, 8: every demo reused the ``postgres`` database, earlier demos' runs and all."""
    from pipeline.demo import metadb

    p = plan(tmp_path, "s3")
    url = p.airflow_env()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert url == metadb.database_url(p.postgres_port, metadb.RUN_DATABASE)
    airflow = comp.airflow_component(p)
    cut = airflow.argv.index("--")
    prepare, command = airflow.argv[:cut], airflow.argv[cut + 1 :]
    assert prepare[1:] == ("-m", "pipeline.demo.metadb", "--port", str(p.postgres_port),
                           "--database", metadb.RUN_DATABASE)  # fmt: skip
    assert command[-1] == "standalone" and command[0].endswith("airflow")
    assert "scheduler" in airflow.waits_for


def test_the_start_timeout_is_a_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_VAR_DIR", str(tmp_path / "var"))
    assert options.parse([]).start_timeout_s == options.START_TIMEOUT_S == 1800.0
    assert options.parse(["--start-timeout", "3600"]).start_timeout_s == 3600.0
