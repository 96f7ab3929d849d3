"""Ed25519 signatures of bus-to-bus HTTP bodies (pynacl).

A bus signs the exact body bytes it POSTs and names itself in a header; the
receiver verifies the signature with the public key the twin directory holds
for that twin. Keys travel as standard base64 of their 32 raw bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

import nacl.exceptions
import nacl.signing

from pipeline.errors import ConfigError, SignatureError

#: HTTP headers carrying the sender twin id and the base64 signature of the body.
TWIN_HEADER = "X-Sluice-Twin"
SIGNATURE_HEADER = "X-Sluice-Signature"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str, *, size: int, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{what} is not valid base64") from exc
    if len(raw) != size:
        raise ConfigError(f"{what} must be {size} bytes, got {len(raw)}")
    return raw


class Signer:
    """Signs bodies with one twin's private key."""

    def __init__(self, seed: bytes) -> None:
        self._key = nacl.signing.SigningKey(seed)

    @classmethod
    def generate(cls) -> Signer:
        return cls(os.urandom(32))

    @classmethod
    def from_file(cls, path: str | Path) -> Signer:
        """Read a key file written by ``sluice bus keygen`` (base64 of the 32-byte seed)."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read bus key file {path}: {exc}") from exc
        return cls(unb64(text, size=32, what=f"bus key file {path}"))

    @property
    def seed(self) -> bytes:
        return bytes(self._key)

    @property
    def public_key(self) -> str:
        return b64(bytes(self._key.verify_key))

    def sign(self, body: bytes) -> str:
        return b64(self._key.sign(body).signature)

    def write(self, path: str | Path) -> None:
        """Write the seed to ``path`` readable by its owner only; never overwrite."""
        target = Path(path)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(b64(self.seed) + "\n")


class Verifier:
    """Checks signatures made by one twin."""

    def __init__(self, public_key: str) -> None:
        self._key = nacl.signing.VerifyKey(unb64(public_key, size=32, what="public key"))

    def verify(self, body: bytes, signature: str) -> None:
        """Raise :class:`SignatureError` unless ``signature`` signs ``body``."""
        try:
            sig = base64.b64decode(signature, validate=True)
            self._key.verify(body, sig)
        except (binascii.Error, ValueError, nacl.exceptions.BadSignatureError) as exc:
            raise SignatureError("bad signature") from exc
