"""The duplex-half table of states.py: total, and as the protocol's theory of operation says."""

from __future__ import annotations

from pipeline.dialogue.packets import PacketType
from pipeline.dialogue.states import DUPLEX_PACKET_LOCAL, ON_DUPLEX_PACKET, Half, HalfAction

DUPLEX_TYPES = {
    PacketType.DUPLEX_INITIAL,
    PacketType.DUPLEX_REQUEST,
    PacketType.DUPLEX_RESPONSE,
    PacketType.DUPLEX_REQUEST_END,
    PacketType.DUPLEX_RESPONSE_END,
}


def test_every_duplex_packet_has_an_action_for_every_half() -> None:
    assert set(DUPLEX_PACKET_LOCAL) == DUPLEX_TYPES
    assert set(ON_DUPLEX_PACKET) == {(ptype, half) for ptype in DUPLEX_TYPES for half in Half}


def test_request_packets_name_the_peers_duplexes_and_response_packets_ours() -> None:
    ours = {ptype for ptype, local in DUPLEX_PACKET_LOCAL.items() if local}
    assert ours == {PacketType.DUPLEX_RESPONSE, PacketType.DUPLEX_RESPONSE_END}


def test_only_a_late_packet_for_our_own_duplex_is_ignored() -> None:
    for (ptype, half), action in ON_DUPLEX_PACKET.items():
        if half is Half.NONE and ptype is not PacketType.DUPLEX_INITIAL:
            expected = HalfAction.STALE if DUPLEX_PACKET_LOCAL[ptype] else HalfAction.UNKNOWN_ID
            assert action is expected, ptype
        if half is Half.ENDED:
            assert action in {HalfAction.AFTER_END, HalfAction.DUPLICATE_ID}, ptype


def test_only_an_open_half_takes_data_or_an_end() -> None:
    for (ptype, half), action in ON_DUPLEX_PACKET.items():
        if action in {HalfAction.DATA, HalfAction.END}:
            assert half is Half.OPEN, ptype
        if action is HalfAction.OPEN:
            assert (ptype, half) == (PacketType.DUPLEX_INITIAL, Half.NONE)
