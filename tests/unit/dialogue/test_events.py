"""ConnectionClosed.public: the one place a Dialogue close becomes wire text."""

from __future__ import annotations

import pytest

from pipeline.dialogue.events import MAX_CLOSE_REASON, CloseCode, ConnectionClosed
from pipeline.errors import (
    InternalProtocolError,
    LocalProtocolError,
    PayloadTooLarge,
    ProtocolError,
    RemoteProtocolError,
)

SECRET = "KeyError('/srv/sluice/secret.py: token=abc')"


def internal() -> InternalProtocolError:
    error = InternalProtocolError(f"internal error: {SECRET}")
    error.__cause__ = KeyError(SECRET)
    return error


@pytest.mark.parametrize(
    ("error", "clean", "expected"),
    [
        (None, True, (CloseCode.NORMAL, "")),
        (None, False, (CloseCode.GOING_AWAY, "going away")),
        (internal(), False, (CloseCode.INTERNAL_ERROR, "internal error")),
        # A bug's raiser cannot choose the text: internal errors are always the fixed one.
        (
            InternalProtocolError(SECRET, public=SECRET),
            False,
            (CloseCode.INTERNAL_ERROR, "internal error"),
        ),
        (LocalProtocolError(SECRET), False, (CloseCode.INTERNAL_ERROR, "protocol error")),
        (
            RemoteProtocolError(f"request id 7 already pending {SECRET}", public="duplicate id"),
            False,
            (CloseCode.PROTOCOL_ERROR, "duplicate id"),
        ),
        (RemoteProtocolError(SECRET), False, (CloseCode.PROTOCOL_ERROR, "protocol error")),
        (
            PayloadTooLarge(f"2000000 bytes exceed {SECRET}"),
            False,
            (CloseCode.MESSAGE_TOO_BIG, "payload too large"),
        ),
    ],
)
def test_public_close_carries_only_public_texts(
    error: ProtocolError | None, clean: bool, expected: tuple[CloseCode, str]
) -> None:
    closed = ConnectionClosed(reason=str(error) if error else "closed", clean=clean, error=error)
    code, text = closed.public()
    assert (code, text) == expected
    assert "secret" not in text and "Error(" not in text and "/" not in text


def test_public_text_fits_a_websocket_close_frame() -> None:
    error = RemoteProtocolError("x", public="é" * 100)  # 200 bytes of UTF-8
    _, text = ConnectionClosed(reason="x", clean=False, error=error).public()
    assert len(text.encode()) <= MAX_CLOSE_REASON
    assert text == "é" * (MAX_CLOSE_REASON // 2)  # cut between characters, never inside one
