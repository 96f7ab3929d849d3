"""The coverage view through a real Airflow API server: JSON, page, links, auth, Airflow's own UI.

The lake's ``archive_log`` holds three intervals of the chain stream (two
adjacent, then a gap) written by the run the test triggers through the REST
API, and one of the plain stream by a run Airflow never heard of. Redis holds
entries from inside the second interval onwards, so the trim point, the hot
window and the next safe trim all have known values.
"""

from __future__ import annotations

import concurrent.futures
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from pipeline import keys
from tests.integration.status.cdp import chromium
from tests.support.poll import until_sync

from .conftest import CHAIN, PLAIN, ApiServer, write_archive_log

DAG = "sluice_archive"
SHOT = Path(__file__).resolve().parents[3] / "bench-results" / "airflow-coverage.png"
MINUTE = 60_000


@pytest.fixture(scope="module")
def system(api_server: ApiServer) -> dict[str, Any]:
    """The data the view should show, written before the first look."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    base = int((now - timedelta(minutes=30)).timestamp() * 1000)
    run_end = now - timedelta(minutes=10)
    with api_server.client() as http:
        reply = http.post(
            f"/api/v2/dags/{DAG}/dagRuns",
            json={
                "dag_run_id": "manual__view-test",
                "logical_date": (run_end - timedelta(minutes=5)).isoformat(),
                "data_interval_start": (run_end - timedelta(minutes=5)).isoformat(),
                "data_interval_end": run_end.isoformat(),
            },
        )
        assert reply.status_code == 200, reply.text
        run_id = reply.json()["dag_run_id"]
        # What the run's `shards` task returns: archive[0] has the chain stream, [1] the plain one.
        reply = http.post(
            f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/shards/xcomEntries",
            json={"key": "return_value", "value": [[CHAIN], [PLAIN]]},
        )
        assert reply.status_code in (200, 201), reply.text
    write_archive_log(
        api_server.lake,
        [
            {
                "stream": CHAIN,
                "start_ms": base,
                "end_ms": base + 5 * MINUTE,
                "entries": 5,
                "run_id": run_id,
            },
            {
                "stream": CHAIN,
                "start_ms": base + 5 * MINUTE,
                "end_ms": base + 10 * MINUTE,
                "entries": 7,
                "run_id": run_id,
            },
            {
                "stream": CHAIN,
                "start_ms": base + 15 * MINUTE,
                "end_ms": base + 20 * MINUTE,
                "entries": 3,
                "run_id": run_id,
            },
            {
                "stream": PLAIN,
                "start_ms": base,
                "end_ms": base + 5 * MINUTE,
                "entries": 2,
                "run_id": "scheduled__unknown",
            },
        ],
    )
    client = redis.Redis.from_url(api_server.redis_url)
    try:
        client.flushdb()
        first_ms = base + 6 * MINUTE
        for i in range(40):
            client.xadd(keys.stream(CHAIN), {"d": b"x"}, id=f"{first_ms + i * 30_000}-0")
    finally:
        client.close()
    return {"base": base, "run_id": run_id, "first_ms": first_ms, "last_ms": first_ms + 39 * 30_000}


def _coverage(api_server: ApiServer) -> dict[str, Any]:
    with api_server.client() as http:
        reply = http.get("/sluice/coverage.json")
    assert reply.status_code == 200, f"{reply.status_code} {reply.text}\n{api_server.log_tail()}"
    assert reply.headers["content-type"].startswith("application/json")
    data: dict[str, Any] = reply.json()
    return data


def test_coverage_json_per_stream(api_server: ApiServer, system: dict[str, Any]) -> None:
    data = _coverage(api_server)
    assert data["lake"]["error"] is None, data["lake"]
    assert data["airflow"]["error"] is None, data["airflow"]
    assert data["redis"]["up"], data["redis"]
    assert data["redis"]["source"] == "connection sluice_redis"
    streams = {s["name"]: s for s in data["streams"]}
    assert set(streams) == {CHAIN, PLAIN}

    base, first_ms, last_ms = system["base"], system["first_ms"], system["last_ms"]
    chain = streams[CHAIN]
    cov = chain["coverage"]
    assert cov["runs"] == [[base, base + 10 * MINUTE], [base + 15 * MINUTE, base + 20 * MINUTE]]
    assert cov["gaps"] == [[base + 10 * MINUTE, base + 15 * MINUTE]]
    assert (cov["intervals"], cov["entries"], cov["blocks"]) == (3, 15, 15)
    assert cov["trim_point_ms"] == first_ms
    # The oldest entry is in the first run: a safe trim may cut up to that run's end.
    assert cov["trimmable_to_ms"] == base + 10 * MINUTE
    assert cov["unarchived_from_ms"] == base + 20 * MINUTE
    assert chain["redis"] == {
        "length": 40,
        "first_id": f"{first_ms}-0",
        "last_id": f"{last_ms}-0",
    }

    # The archive runs, newest first, link to their DAG run and the archive task's log.
    rows = chain["archive_runs"]
    assert [r["start_ms"] for r in rows] == [base + 15 * MINUTE, base + 5 * MINUTE, base]
    run_id = system["run_id"]
    quoted = quote(run_id, safe="")
    for row in rows:
        assert row["run_id"] == run_id
        assert row["state"] == "queued"
        assert row["run_path"] == f"/dags/{DAG}/runs/{quoted}"
        assert row["log_path"] == f"/dags/{DAG}/runs/{quoted}/tasks/archive/mapped/0"

    plain = streams[PLAIN]
    assert plain["redis"] == {"length": 0, "first_id": None, "last_id": None}
    assert plain["coverage"]["trimmable_to_ms"] is None
    (row,) = plain["archive_runs"]
    # A run Airflow does not know: still linked, its state unknown, the log link generic.
    assert row["state"] is None
    assert row["log_path"] == f"/dags/{DAG}/runs/scheduled__unknown/tasks/archive/mapped"

    runs = {r["run_id"]: r for r in data["dag_runs"]}
    assert runs[run_id]["streams"] == [CHAIN, PLAIN]
    assert runs[run_id]["run_path"] == f"/dags/{DAG}/runs/{quoted}"
    assert data["ui_base"] == ""


def test_links_open_in_airflows_ui(api_server: ApiServer, system: dict[str, Any]) -> None:
    data = _coverage(api_server)
    chain = next(s for s in data["streams"] if s["name"] == CHAIN)
    with api_server.client() as http:
        for path in (chain["archive_runs"][0]["run_path"], chain["archive_runs"][0]["log_path"]):
            page = http.get(path)
            assert page.status_code == 200, path
            assert '<div id="root"' in page.text or "id=root" in page.text, page.text[:300]
        # The run the link names exists in Airflow's public API.
        run = http.get(f"/api/v2/dags/{DAG}/dagRuns/{quote(system['run_id'], safe='')}")
        assert run.status_code == 200 and run.json()["state"] == "queued"


def test_page_is_served_and_polls_the_json(api_server: ApiServer, system: dict[str, Any]) -> None:
    with api_server.client() as http:
        page = http.get("/sluice/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "<title>Sluice coverage</title>" in page.text
    # Relative: works under any base path, and inside the UI's iframe.
    assert 'fetch("coverage.json"' in page.text


def test_snapshots_and_lake_reads_are_shared(api_server: ApiServer, system: dict[str, Any]) -> None:
    before = _coverage(api_server)["stats"]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda _: _coverage(api_server), range(32)))
    after = max((r["stats"] for r in replies), key=lambda s: s["builds"])
    # Inside Airflow's API server the viewers share snapshots and lake reads: fewer
    # of either than viewers. That it is one per TTL exactly is a condition on a clock
    # moved by hand, in tests/unit/board/test_board.py (no elapsed time asserted here).
    assert after["builds"] - before["builds"] < len(replies)
    assert after["lake_reads"] - before["lake_reads"] < len(replies)


def test_auth_is_required(api_server: ApiServer, system: dict[str, Any]) -> None:
    with api_server.client(auth=False) as http:
        for path in ("/sluice/coverage.json", "/sluice/"):
            reply = http.get(path)
            assert reply.status_code == 401, (path, reply.status_code)
            assert "Traceback" not in reply.text
        forged = http.get("/sluice/coverage.json", headers={"Authorization": "Bearer not-a-jwt"})
        assert forged.status_code in (401, 403)
        # The UI's session cookie works too: that is what the iframe sends.
        http.cookies.set("_token", api_server.token)
        assert http.get("/sluice/coverage.json").status_code == 200


def test_airflow_ui_and_api_still_work(api_server: ApiServer) -> None:
    with api_server.client() as http:
        dags = http.get("/api/v2/dags", params={"limit": 100})
        assert dags.status_code == 200
        ids = {d["dag_id"] for d in dags.json()["dags"]}
        assert {"sluice_archive", "sluice_audit", "sluice_maintenance", "sluice_replay"} <= ids
        plugins = http.get("/api/v2/plugins")
        assert plugins.status_code == 200
        ours = next(p for p in plugins.json()["plugins"] if p["name"] == "sluice_coverage")
        assert ours["fastapi_apps"][0]["url_prefix"] == "/sluice"
        (view,) = ours["external_views"]
        assert (view["url_route"], view["href"], view["destination"]) == (
            "sluice_coverage",
            "sluice/",
            "nav",
        )
        assert not http.get("/api/v2/importErrors").json()["import_errors"]
        # The UI: its root, the plugin's page in the navigation, the DAG's grid data.
        for path in ("/", "/plugin/sluice_coverage", f"/dags/{DAG}"):
            page = http.get(path)
            assert page.status_code == 200, path
            assert "text/html" in page.headers["content-type"]
        grid = http.get(f"/ui/grid/structure/{DAG}")
        assert grid.status_code == 200, grid.text
        assert {"streams", "archive", "trim"} <= {n["id"] for n in grid.json()}


def test_no_traceback_when_unauthorized_paths_are_probed(api_server: ApiServer) -> None:
    with api_server.client() as http:
        reply = http.get("/sluice/nothing-here")
    assert reply.status_code == 404
    assert "Traceback" not in reply.text


async def test_view_inside_airflows_ui_in_chromium(
    api_server: ApiServer, system: dict[str, Any], tmp_path: Path
) -> None:
    """Logged in (the UI's ``_token`` cookie), the nav entry shows the page with live data."""
    frame = "document.querySelector('iframe')"
    doc = f"{frame}?.contentDocument"
    async with chromium(tmp_path / "profile", width=1400, height=1300) as page:
        await page.send(
            "Network.setCookie",
            {"name": "_token", "value": api_server.token, "url": api_server.url},
        )
        # Airflow's own DAG list still renders with the plugin loaded.
        await page.goto(f"{api_server.url}/dags")
        await page.wait_for("document.body?.innerText?.includes('sluice_archive')", wait_s=60)
        # ... and the DAG's grid, with its tasks and the run the test triggered.
        await page.goto(f"{api_server.url}/dags/{DAG}")
        await _wait_text(page, "streams", "archive", "trim", "publish")
        await page.goto(f"{api_server.url}/plugin/sluice_coverage")
        src = await page.wait_for(f"{frame}?.getAttribute('src')", wait_s=60)
        assert src.rstrip("/").endswith("sluice"), src
        await page.wait_for(f"{doc}?.body?.dataset.loaded === '1'", wait_s=30)
        names = await page.evaluate(
            f"[...{doc}.querySelectorAll('section.stream')].map(s => s.dataset.stream)"
        )
        assert names == [CHAIN, PLAIN]
        chain = f"{doc}.querySelector('section[data-stream=\"{CHAIN}\"]')"
        assert await page.evaluate(f"{chain}.querySelectorAll('.timeline .run').length") == 2
        assert await page.evaluate(f"{chain}.querySelectorAll('.timeline .gap').length") == 1
        assert await page.evaluate(f"{chain}.querySelectorAll('.timeline .hot').length") == 1
        links = await page.evaluate(
            f"[...{chain}.querySelectorAll('table.runs a')].map(a => [a.getAttribute('href'), a.target])"
        )
        quoted = quote(system["run_id"], safe="")
        assert [f"/dags/{DAG}/runs/{quoted}", "_top"] in links
        assert [f"/dags/{DAG}/runs/{quoted}/tasks/archive/mapped/0", "_top"] in links
        assert await page.evaluate(f"{doc}.getElementById('error').textContent") == ""
        await page.screenshot(SHOT)
        # The links lead to pages of Airflow's UI (its router knows them: no 404 page).
        for path in (
            f"/dags/{DAG}/runs/{quoted}",
            f"/dags/{DAG}/runs/{quoted}/tasks/archive/mapped/0",
        ):
            await page.goto(api_server.url + path)
            await _wait_text(page, "manual__view-test", "archive")
            assert "Page Not Found" not in await page.evaluate("document.body.innerText"), path
    assert SHOT.stat().st_size > 10_000


async def _wait_text(page: Any, *texts: str, wait_s: float = 30.0) -> None:
    """Wait until the page shows every text; fail with what it shows instead."""
    try:
        await page.wait_for(
            f"{list(texts)!r}.every(t => document.body?.innerText?.includes(t))", wait_s=wait_s
        )
    except TimeoutError:
        shown = await page.evaluate("document.body?.innerText")
        raise AssertionError(f"page lacks {texts}; it shows:\n{shown}") from None


def test_zz_lake_and_redis_faults_are_reported_not_raised(
    api_server: ApiServer, system: dict[str, Any]
) -> None:
    """Last in the module (it breaks the lake and stops Redis): both show up in the JSON, 200."""
    log_dir = Path(api_server.lake) / "archive_log" / "_delta_log"
    newest = max(int(p.stem) for p in log_dir.glob("*.json"))
    (log_dir / f"{newest + 1:020d}.json").write_text("not json\n")
    api_server.redis.stop()
    data = until_sync(
        lambda: _coverage(api_server),
        "the lake's error and Redis down in the coverage JSON",
        accept=lambda d: d["lake"]["error"] and not d["redis"]["up"],
        within_s=20,
        every_s=0.25,
    )
    assert "archive_log" in data["lake"]["error"], data["lake"]
    assert data["redis"]["error"].startswith("redis unavailable"), data["redis"]
    text = json.dumps(data)
    assert "Traceback" not in text and "start_thread" not in text  # no Python or Rust backtrace
    # The last good read of the lake is still shown (stale, with its error), Airflow's part too.
    chain = next(s for s in data["streams"] if s["name"] == CHAIN)
    assert chain["coverage"]["run_count"] == 2
    assert chain["redis"] is None
    assert chain["archive_runs"][0]["state"] == "queued"
    with api_server.client() as http:
        assert http.get("/sluice/").status_code == 200
        assert http.get("/api/v2/dags").status_code == 200
