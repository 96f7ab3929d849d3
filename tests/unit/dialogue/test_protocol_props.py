"""Property: any interleaving of operations between two correct machines, with bytes delivered
in arbitrary chunks, never produces a protocol error, keeps every stream in order, answers each
request at most once, and ends in a clean close."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dialogue import events as ev
from pipeline.dialogue.protocol import Dialogue, Role, State


@dataclass
class Side:
    machine: Dialogue
    wire: bytearray = field(default_factory=bytearray)  # bytes produced, not yet delivered
    sent_messages: list[bytes] = field(default_factory=list)
    got_messages: list[bytes] = field(default_factory=list)
    my_requests: dict[int, bytes] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    outcomes: dict[int, list[bytes | None]] = field(default_factory=dict)
    incoming: dict[int, bytes] = field(default_factory=dict)
    duplexes: dict[tuple[int, bool], list[bytes]] = field(default_factory=dict)  # sent
    received: dict[tuple[int, bool], list[bytes]] = field(default_factory=dict)
    closed: list[ev.ConnectionClosed] = field(default_factory=list)
    counter: int = 0


def produce(side: Side) -> None:
    side.wire += side.machine.data_to_send()


def handle(side: Side) -> None:
    m = side.machine
    for event in m.events_received():
        if isinstance(event, ev.MessageReceived):
            side.got_messages.append(event.data)
        elif isinstance(event, ev.RequestReceived):
            assert event.id not in side.incoming
            side.incoming[event.id] = event.data
        elif isinstance(event, ev.PeerCancelledRequest):
            del side.incoming[event.id]
        elif isinstance(event, ev.ResponseReceived):
            side.outcomes.setdefault(event.id, []).append(event.data)
        elif isinstance(event, ev.RequestDeclined):
            side.outcomes.setdefault(event.id, []).append(None)
        elif isinstance(event, ev.DuplexOpened):
            side.duplexes[(event.id, False)] = []
            side.received[(event.id, False)] = []
        elif isinstance(event, ev.DuplexData):
            side.received[(event.id, event.local)].append(event.data)
            m.consumed(event.id, event.local, len(event.data))
        elif isinstance(event, ev.ConnectionClosed):
            side.closed.append(event)
    produce(side)


def deliver(src: Side, dst: Side, nbytes: int) -> None:
    chunk = bytes(src.wire[:nbytes])
    del src.wire[:nbytes]
    if chunk:
        dst.machine.receive_data(chunk)
        handle(dst)


OPS = st.one_of(
    st.tuples(st.just("msg"), st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("req"), st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("respond"), st.booleans(), st.integers(0, 7)),
    st.tuples(st.just("cancel"), st.booleans(), st.integers(0, 7)),
    st.tuples(st.just("open"), st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("dsend"), st.booleans(), st.integers(0, 7)),
    st.tuples(st.just("dend"), st.booleans(), st.integers(0, 7)),
    st.tuples(st.just("deliver"), st.booleans(), st.integers(1, 200)),
)


def apply(op: tuple[str, bool, int], sides: tuple[Side, Side]) -> None:
    kind, which, k = op
    me, peer = (sides[0], sides[1]) if which else (sides[1], sides[0])
    m = me.machine
    me.counter += 1
    tag = b"%d-%d" % (which, me.counter)
    if kind == "msg":
        m.send_message(tag * k)
        me.sent_messages.append(tag * k)
    elif kind == "req":
        pid = m.send_request(tag)
        me.my_requests[pid] = tag
    elif kind == "respond" and me.incoming:
        pid = sorted(me.incoming)[k % len(me.incoming)]
        data = me.incoming.pop(pid)
        assert m.respond(pid, None if k == 0 else b"re:" + data)
    elif kind == "cancel":
        live = [p for p in me.my_requests if p not in me.cancelled and p not in me.outcomes]
        if live:
            pid = live[k % len(live)]
            assert m.cancel_request(pid)
            me.cancelled.add(pid)
    elif kind == "open":
        pid = m.open_duplex(tag if k else None)
        me.duplexes[(pid, True)] = []
        me.received[(pid, True)] = []
    elif kind in ("dsend", "dend"):
        keys = sorted(key for key in me.duplexes if m.can_send(*key))
        if keys:
            key = keys[k % len(keys)]
            if kind == "dend":
                m.duplex_end(*key, b"err" if k % 2 else None)
            elif m.send_credit(*key) in (None,) or (m.send_credit(*key) or 0) > 0:
                m.duplex_send(*key, tag)
                me.duplexes[key].append(tag)
    elif kind == "deliver":
        deliver(me, peer, k)
    produce(me)


def finish(client: Side, server: Side) -> None:
    for _ in range(50):
        deliver(client, server, len(client.wire))
        deliver(server, client, len(server.wire))
    client.machine.close()
    produce(client)
    for _ in range(50):
        deliver(client, server, len(client.wire))
        s = server.machine
        for pid in list(server.incoming):
            s.respond(pid, b"re:" + server.incoming.pop(pid))
        for key in list(server.duplexes):
            if s.can_send(*key):
                s.duplex_end(*key)
        handle(server)
        deliver(server, client, len(server.wire))
        if not client.wire and not server.wire:
            break


def check(client: Side, server: Side) -> None:
    for me, peer in ((client, server), (server, client)):
        assert me.closed and me.closed[-1].clean, me.closed
        assert me.closed[-1].error is None
        assert me.machine.state is State.CLOSED
        assert peer.got_messages == me.sent_messages
        assert not me.cancelled & me.outcomes.keys()  # answers to cancelled requests are ignored
        for pid, outcomes in me.outcomes.items():
            assert len(outcomes) == 1  # never answered twice
            assert outcomes[0] in (None, b"re:" + me.my_requests[pid])
        for (pid, local), sent in me.duplexes.items():
            got = peer.received.get((pid, not local), [])
            assert got == sent  # everything sent before the close arrives, in order


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=60), st.sampled_from([None, 8, 64]))
def test_random_interleavings_on_a_pair(
    ops: list[tuple[str, bool, int]], window: int | None
) -> None:
    client = Side(Dialogue(Role.CLIENT, window=window))
    server = Side(Dialogue(Role.SERVER, window=window))
    produce(client)
    produce(server)
    for op in ops:
        apply(op, (client, server))
        assert not client.closed and not server.closed
    finish(client, server)
    check(client, server)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=2048),
    st.integers(1, 64),
    st.sampled_from([Role.CLIENT, Role.SERVER]),
    st.sampled_from([None, 64]),
)
def test_fuzz_machine_never_raises_on_random_bytes(
    data: bytes, chunk: int, role: Role, window: int | None
) -> None:
    machine = Dialogue(role, max_frame=256, window=window)
    for start in range(0, len(data), chunk):
        machine.receive_data(data[start : start + chunk])  # never raises
        assert machine._decoder.buffered <= 9 + 256 + chunk
    machine.receive_eof()
    events = machine.events_received()
    assert isinstance(events[-1], ev.ConnectionClosed)
    assert machine.state is State.CLOSED
