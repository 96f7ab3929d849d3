"""Where the local PostgreSQL cluster goes: a directory its user can reach."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.local import postgres as localpostgres


def test_a_directory_not_made_yet_is_judged_by_its_existing_ancestors(tmp_path: Path) -> None:
    # a fresh clone has no var/demo/airflow yet: the check must not stat it
    missing = tmp_path / "var" / "demo" / "airflow"
    tmp_path.chmod(0o700)
    try:
        assert not localpostgres._reachable(os.getuid() + 1, missing)
        assert localpostgres._reachable(os.getuid(), missing)
    finally:
        tmp_path.chmod(0o755)


def test_an_unreachable_directory_gets_a_stable_stand_in(tmp_path: Path) -> None:
    if localpostgres.run_as() is None:
        assert localpostgres.reachable_dir(tmp_path / "x") == tmp_path / "x"
        return
    tmp_path.chmod(0o700)
    try:
        first = localpostgres.reachable_dir(tmp_path / "not" / "made")
        assert first != tmp_path / "not" / "made"
        assert first == localpostgres.reachable_dir(tmp_path / "not" / "made")
    finally:
        tmp_path.chmod(0o755)
