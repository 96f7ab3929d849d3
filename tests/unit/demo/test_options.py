"""The demo's options: ``sluice demo --help`` needs no extra, its port flags say their defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.demo import options

ROOT = Path(__file__).resolve().parents[3]


def test_the_port_flags_say_what_they_are_and_their_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLUICE_VAR_DIR", str(tmp_path / "var"))
    with pytest.raises(SystemExit) as exc:
        options.parse(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag, what in (("--serve-port", "status page"), ("--airflow-port", "Airflow")):
        assert f"{flag} {flag.upper()[2:].replace('-', '_')} the {what}" in text
    assert "Spark Connect port (default: 15002)" in text


def test_the_options_load_no_rich() -> None:
    """``sluice demo --help`` on an install without [demo]: rich may not be imported."""
    code = "import sys; import pipeline.demo.options; print('rich' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
