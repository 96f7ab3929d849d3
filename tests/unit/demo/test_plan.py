"""The demo's plan puts the lake where --lake says, for every component alike."""

from __future__ import annotations

from pathlib import Path

from pipeline.demo import components as comp


def plan(tmp_path: Path, lake: str) -> comp.Plan:
    return comp.Plan.make(
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
    assert (p.store_dir / comp.LAKE_BUCKET).is_dir()  # the bucket, made before it starts
    assert f"127.0.0.1:{p.store_port}" in store.argv and "ROOT_ACCESS_KEY" in store.env
