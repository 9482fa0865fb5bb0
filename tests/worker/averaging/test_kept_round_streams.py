"""Outer round messages on kept streams (protocol v2: worker/averaging/kept_streams.py and
outer_link.py's `_handle_stream` / `_send_once`), over real sockets on 127.0.0.1 standing in for
p2pd's: a groupmate's messages share one stream, each screened and answered; a stranger, a bad
message, a peer gone from the group and an idle stream each end theirs; a sender recovers from a
stream closed under it and speaks v1 to a groupmate of the last version."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine
from typing import Any

import pytest

from p2ptrain.worker import kept_streams
from p2ptrain.worker.averaging import outer_link
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.kept_streams import IdleStreams
from p2ptrain.worker.traffic import Traffic
from tests.worker.averaging.test_outer_exchange import PEERS
from tests.worker.averaging.test_outer_round_hostile import key, part
from tests.worker.socket_net import Handler, SocketNet


def message(step: int, payload: bytes = b"abcd") -> bytes:
    return part(key(step), num_bytes=len(payload)).encode() + payload


class _Transport:
    """What P2PRoundLink uses of a Transport: its handlers go to `net`; its streams open
    through `net` as its own peer id."""

    def __init__(self, peer: str, net: SocketNet, protocols: tuple[str, ...]) -> None:
        self.peer_id, self.traffic, self.net = peer, Traffic(), net

        async def register(protocol: str, handler: Handler) -> None:
            if protocol in protocols:
                net.handlers[protocol] = handler

        self.p2p = types.SimpleNamespace(add_binary_stream_handler=register)

    async def open_stream(self, peer_id: str, protocol: str) -> tuple[Any, Any]:
        return await self.net.open(self.peer_id, protocol)

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run(coroutine)


def _pair(
    receiver_protocols: tuple[str, ...] = (wire.PROTOCOL, wire.STREAM_PROTOCOL),
) -> tuple[outer_link.P2PRoundLink, outer_link.P2PRoundLink, SocketNet]:
    """A sender (PEERS[0]) and a receiver (PEERS[2]) whose group holds the sender."""
    net = SocketNet()
    receiver_transport = _Transport(PEERS[2], net, receiver_protocols)
    receiver = outer_link.P2PRoundLink(receiver_transport)  # type: ignore[arg-type]
    receiver.inbox.admit_group(PEERS[:3], 1000)
    sender = outer_link.P2PRoundLink(_Transport(PEERS[0], net, ()))  # type: ignore[arg-type]
    return sender, receiver, net


async def _send_all(sender: outer_link.P2PRoundLink, datas: list[bytes]) -> list[bytes]:
    return [await sender._send_once(PEERS[2], data) for data in datas]


# --- the receiver ---


def test_a_groupmates_messages_share_one_stream_each_answered_and_filed() -> None:
    sender, receiver, net = _pair()

    async def scenario() -> list[bytes]:
        answers = await _send_all(sender, [message(s) for s in range(9, 14)])
        sender._idle.close_all()
        await asyncio.sleep(0.1)  # the receiver sees the stream's end
        return answers

    assert asyncio.run(scenario()) == [wire.ACCEPTED] * 5
    assert net.opened == [wire.STREAM_PROTOCOL]  # one stream for all five
    for step in range(9, 14):
        got = receiver.inbox.take(key(step), wire.PART, PEERS[0], 1, 0.0, lambda: False)
        assert got is not None and got[1] == b"abcd"
    sizes = sum(len(message(step)) for step in range(9, 14))
    assert receiver.transport.traffic.bytes_received == sizes


async def _raw_stream(
    receiver: outer_link.P2PRoundLink, peer: str, chunks: list[bytes], wait_s: float = 5.0
) -> tuple[bytes, bool]:
    """Write `chunks` on one v2 stream of `peer`; every answer byte, and whether the receiver
    ended the stream (EOF) within wait_s."""
    net = SocketNet()
    net.handlers[wire.STREAM_PROTOCOL] = receiver._handle_stream
    reader, writer = await net.open(peer, wire.STREAM_PROTOCOL)
    for chunk in chunks:
        writer.write(chunk)
    answers, ended = b"", False
    try:
        async with asyncio.timeout(wait_s):
            while True:
                byte = await reader.read(1)
                if not byte:
                    ended = True
                    break
                answers += byte
    except TimeoutError:
        pass
    writer.close()
    return answers, ended


def test_a_strangers_kept_stream_is_refused_unread() -> None:
    _, receiver, _ = _pair()
    receiver.inbox.admit_group(PEERS[:2], 1000)
    answers, ended = asyncio.run(_raw_stream(receiver, PEERS[2], []))
    assert (answers, ended) == (wire.BUSY, True)
    assert receiver.transport.traffic.bytes_received == 0


def test_a_bad_message_after_good_ones_is_rejected_and_ends_the_stream() -> None:
    _, receiver, _ = _pair()
    cut = part(key(11), num_bytes=4).encode()[:-3]  # a header cut short, then the stream waits
    bad = wire.HEADER_LEN.pack(5) + b"[[[[["
    chunks = [message(9), message(10), bad, cut]
    answers, ended = asyncio.run(_raw_stream(receiver, PEERS[0], chunks, wait_s=8.0))
    assert answers == wire.ACCEPTED * 2 + wire.REJECTED and ended


def test_the_stream_ends_once_its_sender_left_the_group() -> None:
    _, receiver, _ = _pair()

    async def scenario() -> bytes:
        async def leave_soon() -> None:
            await asyncio.sleep(0.2)
            receiver.inbox.admit_group(PEERS[1:3], 1000)

        task = asyncio.create_task(leave_soon())
        net = SocketNet()
        net.handlers[wire.STREAM_PROTOCOL] = receiver._handle_stream
        reader, writer = await net.open(PEERS[0], wire.STREAM_PROTOCOL)
        writer.write(message(9))
        first = await reader.readexactly(1)
        await task
        writer.write(message(10))  # refused unread (no longer a member), and the stream ends
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return first + rest  # read() returned: the receiver ended the stream

    assert asyncio.run(scenario()) == wire.ACCEPTED + wire.BUSY


def test_an_idle_stream_is_closed_without_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    _, receiver, _ = _pair()
    monkeypatch.setattr(kept_streams, "IDLE_S", 0.3)
    monkeypatch.setattr(outer_link, "HEADER_TIMEOUT_S", 0.3)
    answers, ended = asyncio.run(_raw_stream(receiver, PEERS[0], [message(9)], wait_s=5.0))
    assert (answers, ended) == (wire.ACCEPTED, True)
    assert receiver._streams.of(PEERS[0]) == 0  # its place is free again


# --- the sender ---


def test_a_stream_closed_under_the_sender_costs_a_fresh_one_not_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sender, _, net = _pair()
    monkeypatch.setattr(kept_streams, "IDLE_S", 0.2)
    monkeypatch.setattr(outer_link, "HEADER_TIMEOUT_S", 0.2)

    async def scenario() -> list[bytes]:
        first = await sender._send_once(PEERS[2], message(9))
        await asyncio.sleep(1.0)  # the receiver closed it, idle
        second = await sender._send_once(PEERS[2], message(10))
        sender._idle.close_all()
        return [first, second]

    assert asyncio.run(scenario()) == [wire.ACCEPTED] * 2
    assert net.opened == [wire.STREAM_PROTOCOL] * 2


def test_a_groupmate_of_the_last_version_gets_one_message_a_stream() -> None:
    sender, receiver, net = _pair(receiver_protocols=(wire.PROTOCOL,))
    answers = asyncio.run(_send_all(sender, [message(s) for s in range(9, 12)]))
    assert answers == [wire.ACCEPTED] * 3
    assert net.opened == [wire.PROTOCOL] * 3 and PEERS[2] in sender._one_shot
    got = receiver.inbox.take(key(11), wire.PART, PEERS[0], 1, 0.0, lambda: False)
    assert got is not None


# --- the idle streams ---


class _FakeReader:
    def __init__(self) -> None:
        self.eof = False

    def at_eof(self) -> bool:
        return self.eof


class _FakeWriter:
    def __init__(self) -> None:
        self.closed = False
        self.transport = types.SimpleNamespace(abort=self.close)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _stream() -> Any:
    return _FakeReader(), _FakeWriter()


def test_idle_streams_keep_a_few_a_peer_and_drop_stale_or_closed_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    idle, now = IdleStreams(), [100.0]
    monkeypatch.setattr(kept_streams.time, "monotonic", lambda: now[0])
    streams = [_stream() for _ in range(kept_streams.MAX_IDLE_PER_PEER + 1)]
    for stream in streams:
        idle.put("a", stream)
    assert idle.count("a") == kept_streams.MAX_IDLE_PER_PEER and streams[-1][1].closed
    assert idle.take("b") is None
    taken = idle.take("a")
    assert taken is streams[1] and not taken[1].closed
    idle.put("b", _stream())
    streams[0][0].eof = True  # its far end closed it
    assert idle.take("a") is None and streams[0][1].closed
    now[0] += kept_streams.REUSE_S  # b's is stale now, and goes on any take
    assert idle.take("a") is None and idle.count("b") == 0
