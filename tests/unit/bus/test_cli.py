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


def test_keygen_into_a_missing_directory_is_one_line(tmp_path, capsys):
    out = tmp_path / "no" / "such" / "k"
    assert cli.main(["keygen", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot create {out}" in err and "Traceback" not in err


def test_dead_and_register_with_redis_down_are_one_line(capsys):
    from pipeline.runtime.ports import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert cli.main(["dead", "--redis", url]) == 1
    assert cli.main(["register", "--twin", "7", "--url", "http://x", "--redis", url]) == 1
    assert cli.main(["requeue", "--all", "--redis", url]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err] == [
        "sluice bus dead",
        "sluice bus register",
        "sluice bus requeue",
    ]
    assert all("redis unavailable" in line for line in err)


def test_dead_with_nothing_set_aside_says_so_in_one_line(redis_url, capsys):
    assert cli.main(["dead", "--redis", redis_url]) == 0
    assert capsys.readouterr().out == "no dead letters: the bus set nothing aside\n"


@pytest.mark.parametrize(
    "command", [["dead"], ["requeue", "--all"], ["register", "--twin", "7", "--url", "http://x"]]
)
def test_subcommands_refuse_a_cluster_url_in_one_line(command):
    """Issue 31, item 4: a 60-line traceback for redis+cluster:// before; the bus's own line now."""
    url = "redis+cluster://127.0.0.1:1/0"  # refused before any connection is tried
    with pytest.raises(ConfigError, match=r"not redis\+cluster://$") as refused:
        cli.main([*command, "--redis", url])
    assert "\n" not in str(refused.value)
