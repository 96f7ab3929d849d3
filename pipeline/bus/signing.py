"""Ed25519 signatures of bus-to-bus HTTP POSTs (pynacl).

A bus signs each POST and sends three headers: ``X-Sluice-Twin`` (itself),
``X-Sluice-Time`` (its own clock, integer milliseconds since the epoch) and
``X-Sluice-Signature`` (base64 Ed25519). The signature covers
:func:`signed_message`: a version tag, sender twin, receiver twin, path, the
time, then the exact body bytes. So a captured POST cannot be sent to another
twin or endpoint, and the receiver can refuse it once the time has left its
clock window; within the window the envelope ``uid`` (inside the signed body)
is what the receiver remembers. Nothing the *client* set (``now``, ``exp``)
decides whether a POST is fresh.

The layout does not depend on what the body holds, so a body carrying several
envelopes (one signature per POST) signs the same way; a new layout gets a new
:data:`SIGNED_TAG`. Keys travel as standard base64 of their 32 raw bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

import nacl.exceptions
import nacl.signing

from pipeline.errors import ConfigError, SignatureError

#: HTTP headers: the sender twin id, its clock (ms), the base64 signature.
TWIN_HEADER = "X-Sluice-Twin"
TIME_HEADER = "X-Sluice-Time"
SIGNATURE_HEADER = "X-Sluice-Signature"
#: First line of every signed message; names the layout below it.
SIGNED_TAG = b"sluice-bus-post/2"


def signed_message(*, src: int, dst: int, path: str, sent_ms: int, body: bytes) -> bytes:
    """The bytes a POST's signature covers."""
    head = b"%s\n%d\n%d\n%s\n%d\n" % (SIGNED_TAG, src, dst, path.encode(), sent_ms)
    return head + body


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

    def sign(self, message: bytes) -> str:
        return b64(self._key.sign(message).signature)

    def sign_post(self, *, src: int, dst: int, path: str, sent_ms: int, body: bytes) -> str:
        """The ``X-Sluice-Signature`` of one POST (see :func:`signed_message`)."""
        return self.sign(signed_message(src=src, dst=dst, path=path, sent_ms=sent_ms, body=body))

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

    def verify(self, message: bytes, signature: str) -> None:
        """Raise :class:`SignatureError` unless ``signature`` signs ``message``."""
        try:
            sig = base64.b64decode(signature, validate=True)
            self._key.verify(message, sig)
        except (binascii.Error, ValueError, nacl.exceptions.BadSignatureError) as exc:
            raise SignatureError("bad signature") from exc

    def verify_post(
        self, *, src: int, dst: int, path: str, sent_ms: int, body: bytes, signature: str
    ) -> None:
        """Raise :class:`SignatureError` unless ``signature`` signs this POST."""
        message = signed_message(src=src, dst=dst, path=path, sent_ms=sent_ms, body=body)
        self.verify(message, signature)
