from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.lake.cli import _jsonable, main


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["archive", "--stream", "s", "--start-ms", "x", "--end-ms", "2"]) == 2
    assert main(["nope"]) == 2
    assert "invalid" in capsys.readouterr().err


def test_jsonable() -> None:
    @dataclass(frozen=True)
    class R:
        h: bytes
        t: tuple[tuple[int, int], ...]

    assert _jsonable(R(b"\x01", ((1, 2),))) == {"h": "01", "t": [[1, 2]]}


def test_a_retention_below_the_longest_job_is_refused() -> None:
    import argparse

    from pipeline.errors import ConfigError
    from pipeline.lake.jobargs import check_args
    from pipeline.settings import Settings

    settings = Settings.load(env={}, lake_job_timeout_s=7200)
    assert settings.lake.min_retain_hours == 2
    with pytest.raises(ConfigError, match="--retain-hours 1 is below 2"):
        check_args(argparse.Namespace(job="maintain", retain_hours=1), settings)
    check_args(argparse.Namespace(job="maintain", retain_hours=2), settings)
    assert Settings.load(env={}, lake_job_timeout_s=1800).lake.min_retain_hours == 1
