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
