"""``sluice demo``: the whole lake flow once, on this machine, with embedded defaults.

1. Redis: a private ``redis-server`` under ``var/demo/redis`` (or the one in
   ``SLUICE_REDIS_URL``).
2. A synthetic chain with reorgs is written into a chain stream, its entry
   ids inside one past 5-minute data interval, plus a few entries in the next
   interval that are not archived yet.
3. ``sluice_archive`` runs for that interval through Airflow (``dag.test``
   in a child process with its own ``AIRFLOW_HOME`` under ``var/airflow``,
   migrated on first use): archive into Delta, canonical marking, safe trim.
4. The blocks are read back from Delta with the JVM-free reader and printed,
   with a summary: blocks archived, reorged blocks kept non-canonical,
   entries trimmed, entries left in Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from pipeline import keys
from pipeline.chain.batch import ENTRY_FIELD, Block, encode_block
from pipeline.chain.generator import SyntheticChain
from pipeline.errors import ConfigError, LakeError
from pipeline.localredis import LocalRedis
from pipeline.settings import Settings

INTERVAL_MS = 5 * 60 * 1000
#: How far in the past the demo interval ends (older than the hot-retention
#: window, so the safe trim really trims it).
AGE_MS = 2 * 3600 * 1000
#: Entries written after the interval: not archived by this run, so never trimmed.
UNARCHIVED = 3
AIRFLOW_TIMEOUT_S = 600
MIGRATE_TIMEOUT_S = 300

#: Runs in the Airflow child: load the DAG, ``dag.test`` one interval, print a JSON line.
_RUN_DAG = """\
import json, sys
from datetime import datetime, timezone
from airflow.dag_processing.dagbag import DagBag
folder, dag_id, logical_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
bag = DagBag(dag_folder=folder)
if bag.import_errors:
    print(json.dumps({"error": "DAG import errors", "details": bag.import_errors}))
    sys.exit(1)
dag = bag.get_dag(dag_id)
run = dag.test(logical_date=datetime.fromtimestamp(logical_ms / 1000, tz=timezone.utc))
tis = {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in run.get_task_instances()}
print(json.dumps({
    "state": str(run.state),
    "start": run.data_interval_start.isoformat(),
    "end": run.data_interval_end.isoformat(),
    "tasks": tis,
}))
sys.exit(0 if str(run.state) == "success" else 1)
"""


@dataclass(frozen=True, slots=True)
class Interval:
    start_ms: int
    end_ms: int

    @classmethod
    def past(cls, now_ms: int) -> Interval:
        end = (now_ms - AGE_MS) // INTERVAL_MS * INTERVAL_MS
        return cls(end - INTERVAL_MS, end)


def repo_root() -> Path:
    """The checkout holding ``dags/`` and ``plugins/`` (an editable install)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "dags").is_dir():
        raise ConfigError(f"no dags/ next to the package at {root}: run the demo from a checkout")
    return root


@contextmanager
def demo_redis(settings: Settings, directory: Path) -> Iterator[str]:
    """``SLUICE_REDIS_URL`` if set, else a private redis-server stopped on exit."""
    if os.environ.get("SLUICE_REDIS_URL"):
        yield settings.redis_url
        return
    server = LocalRedis(directory).start()
    try:
        yield server.url
    finally:
        server.stop()


def airflow_env(home: Path, root: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }


def ensure_migrated(env: dict[str, str], home: Path, log: Path) -> None:
    """``airflow db migrate`` once per AIRFLOW_HOME (a stamp file remembers it)."""
    stamp = home / ".sluice-migrated"
    if stamp.exists() and (home / "airflow.db").exists():
        return
    home.mkdir(parents=True, exist_ok=True)
    print(f"  migrating the Airflow metadata DB in {home} (first run only)...")
    with log.open("ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=MIGRATE_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise ConfigError(f"airflow db migrate failed; see {log}")
    stamp.write_text("ok\n")


def run_archive_dag(env: dict[str, str], root: Path, interval: Interval, log: Path) -> Any:
    """Run ``sluice_archive`` for ``interval`` with ``dag.test`` in a child process."""
    with log.open("ab") as out:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _RUN_DAG,
                str(root / "dags"),
                "sluice_archive",
                str(interval.end_ms),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=out,
            timeout=AIRFLOW_TIMEOUT_S,
            check=False,
        )
    lines = [line for line in done.stdout.decode("utf-8", "replace").splitlines() if line.strip()]
    result: Any = None
    if lines:
        try:
            result = json.loads(lines[-1])
        except json.JSONDecodeError:
            result = None
    if done.returncode != 0 or not isinstance(result, dict):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise LakeError(f"the sluice_archive run failed: {result}\n--- {log} (tail) ---\n{tail}")
    return result


@dataclass(frozen=True, slots=True)
class Written:
    inside: list[Block]
    #: the canonical chain as of the interval's end
    canonical: list[Block]
    reorgs: int
    total: int


def archive_log(lake_uri: str, stream: str) -> dict[str, Any]:
    """The stream's ``archive_log`` totals, read JVM-free with delta-rs."""
    from deltalake import DeltaTable

    rows = DeltaTable(f"{lake_uri}/archive_log").to_pyarrow_table().to_pylist()
    mine = [r for r in rows if r["stream"] == stream]
    return {k: sum(int(r[k]) for r in mine) for k in ("entries", "blocks", "invalid")}


def write_chain(client: redis.Redis, stream: str, interval: Interval, blocks: int) -> Written:
    """A chain with reorgs, its entries spread over the interval, then a few after it."""
    chain = SyntheticChain(seed=7, reorg_every=9, reorg_depth=3)
    inside = chain.take(blocks)
    canonical, reorgs = list(chain.canonical), chain.reorgs
    after = chain.take(UNARCHIVED)
    step = max(1, (interval.end_ms - interval.start_ms) // (len(inside) + 1))
    ids = [f"{interval.start_ms + (i + 1) * step}-0" for i in range(len(inside))]
    ids += [f"{interval.end_ms + i}-0" for i in range(len(after))]
    key = keys.stream(stream)
    pipe = client.pipeline(transaction=False)
    for block, entry_id in zip([*inside, *after], ids, strict=True):
        pipe.xadd(key, {ENTRY_FIELD: encode_block(block)}, id=entry_id)
    pipe.execute()
    return Written(inside, canonical, reorgs, len(ids))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sluice demo", description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40, help="blocks inside the interval")
    args = parser.parse_args(argv)
    if not 1 <= args.blocks <= 10_000:
        parser.error("--blocks must be between 1 and 10000")
    settings = Settings.load()
    root = repo_root()
    var = Path(settings.var_dir).expanduser().absolute()
    demo_dir = var / "demo"
    demo_dir.mkdir(parents=True, exist_ok=True)
    log = demo_dir / "airflow.log"
    log.write_bytes(b"")
    if os.environ.get("SLUICE_LAKE_URI"):
        lake_uri = settings.lake.uri
    else:
        lake_uri = str(demo_dir / "lake")
        shutil.rmtree(lake_uri, ignore_errors=True)  # the demo's own lake: start clean
    started = time.monotonic()
    with demo_redis(settings, demo_dir / "redis") as redis_url:
        client = redis.Redis.from_url(redis_url, socket_timeout=10)
        try:
            return _run(client, redis_url, lake_uri, root, var, log, args.blocks, started)
        finally:
            client.close()


def _run(
    client: redis.Redis,
    redis_url: str,
    lake_uri: str,
    root: Path,
    var: Path,
    log: Path,
    blocks: int,
    started: float,
) -> int:
    fresh = not os.environ.get("SLUICE_REDIS_URL")
    stream = "chain:demo" if fresh else f"chain:demo-{int(time.time())}"
    key = keys.stream(stream)
    interval = Interval.past(int(time.time() * 1000))
    print(f"sluice demo: Redis {redis_url}, lake {lake_uri}")
    print(f"  stream {stream!r}, data interval [{interval.start_ms}, {interval.end_ms}) ms")
    written = write_chain(client, stream, interval, blocks)
    before = int(client.xlen(key))
    print(
        f"  wrote {before} entries ({written.reorgs} reorgs in the interval);"
        " running sluice_archive in Airflow..."
    )

    home = var / "airflow"
    env = {
        **os.environ,
        **airflow_env(home, root),
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_LAKE_URI": lake_uri,
        "SLUICE_STREAMS": stream,
        "SLUICE_CHAIN_STREAMS": stream,
        "SLUICE_ARCHIVE_CRON": "*/5 * * * *",
    }
    ensure_migrated(env, home, log)
    run = run_archive_dag(env, root, interval, log)
    after = int(client.xlen(key))
    print(f"  Airflow run {run['state']}: {run['start']} .. {run['end']} (log: {log})")

    from pipeline.lake.reader import LakeReader

    reader = LakeReader(lake_uri)
    print("\nCanonical blocks read back from Delta (JVM-free reader):")
    print(f"  {'num':>5}  {'hash':<18}  {'parent':<18}")
    shown = 0
    for batch in reader.iter_canonical(stream, 0, None):
        for row in batch:
            print(f"  {row.num:>5}  {row.hash.hex()[:16]:<18}  {row.parent.hex()[:16]:<18}")
            shown += 1
    canonical = {b.hash for b in written.canonical}
    reorged = [b for b in written.inside if b.hash not in canonical]
    kept = [b for b in reorged if (r := reader.find_hash(stream, b.hash)) and not r.canonical]
    print("\nReorged blocks, kept in the lake with canonical = false:")
    for block in kept:
        print(f"  {block.num:>5}  {block.hash.hex()[:16]:<18}  {block.parent.hex()[:16]:<18}")
    logged = archive_log(lake_uri, stream)
    print("\nSummary:")
    print(f"  entries written in the interval:    {len(written.inside)}")
    print(f"  archive_log: entries {logged.get('entries')}, blocks {logged.get('blocks')}")
    print(f"  canonical blocks in the lake:       {shown}")
    print(f"  reorged blocks kept non-canonical:  {len(kept)} of {len(reorged)}")
    print(f"  Redis entries trimmed:              {before - after} of {before}")
    print(f"  entries left in Redis (unarchived or hot): {after}")
    print(f"  took {time.monotonic() - started:.1f}s")
    ok = (
        shown == len(written.canonical)
        and len(kept) == len(reorged)
        and after >= UNARCHIVED
        and logged.get("blocks") == len(written.inside)
    )
    if not ok:
        print("sluice demo: the lake does not hold what was written", file=sys.stderr)
    return 0 if ok else 1
