from __future__ import annotations

import os
import stat

import pytest

from pipeline.bus.directory import FileDirectory, Peer, parse_document
from pipeline.bus.signing import Signer, Verifier
from pipeline.errors import ConfigError, SignatureError


def test_sign_verify_and_forgery():
    signer = Signer.generate()
    verifier = Verifier(signer.public_key)
    sig = signer.sign(b"body")
    verifier.verify(b"body", sig)
    with pytest.raises(SignatureError):
        verifier.verify(b"body!", sig)
    with pytest.raises(SignatureError):
        verifier.verify(b"body", Signer.generate().sign(b"body"))
    with pytest.raises(SignatureError):
        verifier.verify(b"body", "not base64 **")
    with pytest.raises(SignatureError):
        verifier.verify(b"body", "AAAA")


def test_key_file_round_trip_private_and_never_overwritten(tmp_path):
    signer = Signer.generate()
    path = tmp_path / "twin.key"
    signer.write(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Signer.from_file(path).public_key == signer.public_key
    with pytest.raises(FileExistsError):
        Signer.generate().write(path)


@pytest.mark.parametrize("content", ["", "***", "QUJD"])
def test_bad_key_files(tmp_path, content):
    path = tmp_path / "bad.key"
    path.write_text(content)
    with pytest.raises(ConfigError, match="bus key file"):
        Signer.from_file(path)
    with pytest.raises(ConfigError, match="cannot read"):
        Signer.from_file(tmp_path / "missing.key")


def test_directory_files_json_and_toml(tmp_path):
    key = Signer.generate().public_key
    (tmp_path / "d.json").write_text(f'{{"1001": {{"url": "http://h:1/", "key": "{key}"}}}}')
    (tmp_path / "d.toml").write_text(f'[twins.1002]\nurl = "https://h:2"\nkey = "{key}"\n')
    peers = FileDirectory.load(tmp_path / "d.json").peers
    assert peers[1001].url == "http://h:1" and peers[1001].verifier is not None
    peer = FileDirectory.load(tmp_path / "d.toml").peers[1002]
    assert peer == Peer(1002, "https://h:2", key, peer.verifier)


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        ([], "mapping"),
        ({"x": {"url": "http://a"}}, "not a twin id"),
        ({"1": {}}, "needs a url"),
        ({"1": {"url": "ftp://a"}}, "http"),
        ({"1": {"url": "http://a", "key": 5}}, "base64 text"),
        ({"1": {"url": "http://a", "key": "QUJD"}}, "32 bytes"),
        ({"twins": 3}, "table"),
    ],
)
def test_bad_directories(doc, text):
    with pytest.raises(ConfigError, match=text):
        parse_document(doc)


def test_unreadable_directory_file(tmp_path):
    (tmp_path / "d.json").write_text("{")
    with pytest.raises(ConfigError, match="d.json"):
        FileDirectory.load(tmp_path / "d.json")
    with pytest.raises(ConfigError, match="cannot read"):
        FileDirectory.load(tmp_path / "nope.json")
