from __future__ import annotations

import pytest

from pipeline.bus import cli
from pipeline.bus.signing import Signer
from pipeline.errors import ConfigError


def test_keygen_prints_public_key_and_refuses_overwrite(tmp_path, capsys):
    out = tmp_path / "k"
    assert cli.main(["keygen", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == Signer.from_file(out).public_key
    assert cli.main(["keygen", "--out", str(out)]) == 1
    assert "exists" in capsys.readouterr().err


def test_bus_needs_twin_and_key(monkeypatch):
    for name in ("SLUICE_BUS_TWIN", "SLUICE_BUS_KEY_FILE", "SLUICE_BUS_LEGACY_PEERS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="twin id"):
        cli.main([])
    with pytest.raises(ConfigError, match="private key"):
        cli.main(["--twin", "5"])
