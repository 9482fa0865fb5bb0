"""A peer's failure ends only its stream: inbound handlers (ours and the library's) are guarded,
and pubsub writes whole messages, one at a time per stream (net/guard.py, net/safe_pubsub.py).
Real hosts on loopback in one trio loop."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import PUBSUB_SIGNING_PREFIX, Pubsub
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import encode_uvarint, read_varint_prefixed_bytes

from p2ptrain.net import probe
from p2ptrain.net.safe_pubsub import SafePubsub
from tests.net.test_protocols import host_pair
from tests.net.trio_run import run

SINK = TProtocol("/test/sink/1.0.0")
MESSAGE_BYTES = 150_000  # three yamux frames (64 KiB each at most)
GARBAGE_FRAME = encode_uvarint(64) + b"\xff" * 64  # what once killed every node


def make_pubsub(host: Any, cls: type[Pubsub] = SafePubsub) -> Pubsub:
    return cls(host, GossipSub(protocols=[PROTOCOL_ID_V11], degree=4, degree_low=3, degree_high=8))


def publish_rpc(fill: int) -> rpc_pb2.RPC:
    rpc = rpc_pb2.RPC()
    rpc.publish.add(data=bytes([fill]) * MESSAGE_BYTES, topicIDs=["t"])
    return rpc


async def read_rpcs(stream: INetStream, count: int) -> list[str]:
    """What arrives: the fill byte of each whole message, or the error that ended reading."""
    got: list[str] = []
    try:
        for _ in range(count):
            rpc = rpc_pb2.RPC()
            rpc.ParseFromString(await read_varint_prefixed_bytes(stream))
            data = rpc.publish[0].data
            got.append(f"whole {data[0]}" if data == data[:1] * MESSAGE_BYTES else "mixed")
    except Exception as exc:
        got.append(type(exc).__name__)
    return got


@pytest.mark.parametrize("cls", [Pubsub, SafePubsub])
def test_concurrent_pubsub_writes_arrive_whole(cls: type[Pubsub]) -> None:
    """Two tasks write 150 KB messages on one stream (GossipSub's sending loop and its replay of
    recent messages do). py-libp2p 0.8.1's yamux takes its write lock per frame, so the library's
    messages interleave (the upstream report's reproduction); SafePubsub's arrive whole."""

    async def scenario() -> list[str]:
        async with host_pair() as (a, b):
            received: list[str] = []
            done = trio.Event()

            async def sink(stream: INetStream) -> None:
                received.extend(await read_rpcs(stream, 4))
                done.set()

            b.set_stream_handler(SINK, sink)
            pubsub = make_pubsub(a, cls)
            stream = await a.new_stream(b.get_id(), [SINK])

            async def writer(fill: int) -> None:
                for _ in range(2):
                    assert await pubsub.write_msg(stream, publish_rpc(fill))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer, 1)
                nursery.start_soon(writer, 2)
            with trio.fail_after(10):
                await done.wait()
            return received

    received = run(scenario)
    if cls is SafePubsub:
        assert sorted(received) == ["whole 1", "whole 1", "whole 2", "whole 2"]
    else:  # the first message's frames interleave with the second's: not an RPC any more
        assert received[-1] in ("mixed", "DecodeError"), received


def test_unfinished_write_resets_the_stream() -> None:
    """A write cancelled while yamux waits for the window leaves part of a message: SafePubsub
    resets the stream, so the reader sees a reset, never another message after the part."""

    async def scenario() -> tuple[list[str], bool]:
        async with host_pair() as (a, b):
            received: list[str] = []
            start_reading, done = trio.Event(), trio.Event()

            async def stalled_sink(stream: INetStream) -> None:
                await start_reading.wait()
                received.extend(await read_rpcs(stream, 2))
                done.set()

            b.set_stream_handler(SINK, stalled_sink)
            pubsub = make_pubsub(a)
            async with background_trio_service(pubsub):
                stream = await a.new_stream(b.get_id(), [SINK])
                # a receiver that stopped reading: the window left (grown to MiBs on loopback)
                # shrunk to a few KiB, and no update comes while the sink does not read
                stream.muxed_stream.send_window = 4096  # type: ignore[attr-defined]
                with trio.move_on_after(1.0) as scope:
                    await pubsub.write_msg(stream, publish_rpc(1))
                assert scope.cancelled_caught
                second_written = await pubsub.write_msg(stream, publish_rpc(2))
                start_reading.set()
                with trio.fail_after(10):
                    await done.wait()
                return received, second_written

    received, second_written = run(scenario)
    assert not second_written
    assert received == ["StreamReset"], received


def test_failing_handlers_end_only_their_stream() -> None:
    """A handler of ours that raises, and one garbage frame on the library's own GossipSub
    reader, reset their streams; the host keeps serving the same connection."""

    async def scenario() -> float:
        async with host_pair() as (a, b):

            async def broken(stream: INetStream) -> None:
                await stream.read(1)
                raise ValueError("a handler bug")

            b.set_stream_handler(SINK, broken)
            b.set_stream_handler(probe.PING_PROTOCOL, probe.handle_ping)
            library_pubsub = make_pubsub(b, Pubsub)  # the library's reader, unguarded itself
            async with background_trio_service(library_pubsub):
                for protocol, data in ((SINK, b"x"), (PROTOCOL_ID_V11, GARBAGE_FRAME)):
                    stream = await a.new_stream(b.get_id(), [protocol])
                    await stream.write(data)
                    await trio.sleep(0.5)
                return await probe.measure_rtt_ms(a, b.get_id())

    assert run(scenario) > 0


def test_garbage_message_is_dropped_not_fatal() -> None:
    """A publish whose key is garbage makes the library's signature check raise inside the
    Pubsub service; SafePubsub drops that message and keeps the service running."""

    async def scenario() -> bool:
        async with host_pair() as (a, b):
            pubsub = make_pubsub(b)
            async with background_trio_service(pubsub):
                await pubsub.wait_until_ready()
                await pubsub.subscribe("t")
                rpc = rpc_pb2.RPC()
                rpc.publish.add(
                    from_id=b"\x00\x01garbage",
                    key=b"garbage",
                    signature=b"sig",
                    data=b"x",
                    seqno=b"12345678",
                    topicIDs=["t"],
                )
                payload = rpc.SerializeToString()
                stream = await a.new_stream(b.get_id(), [PROTOCOL_ID_V11])
                await stream.write(encode_uvarint(len(payload)) + payload)
                await trio.sleep(1.0)
                return bool(pubsub.manager.is_running)

    assert run(scenario)


class _CountingPubsub(SafePubsub):
    """SafePubsub that counts the per-message tasks its reader starts."""

    pushed = 0

    async def push_msg(self, msg_forwarder: Any, msg: rpc_pb2.Message) -> None:
        self.pushed += 1
        await super().push_msg(msg_forwarder, msg)


def _signed_message(host: Any, data: bytes, seqno: int) -> rpc_pb2.Message:
    """A gossip message `host` authored and signed, as Pubsub.publish builds one."""
    msg = rpc_pb2.Message(
        data=data, topicIDs=["t"], from_id=host.get_id().to_bytes(), seqno=seqno.to_bytes(8)
    )
    msg.signature = host.get_private_key().sign(
        PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString()
    )
    msg.key = host.get_public_key().serialize()
    return msg


def test_a_copy_of_a_seen_message_starts_no_task() -> None:
    """Every mesh peer forwards a copy of each message: the reader drops a copy of a message
    it has seen before starting a task for it (the library started one per copy); a new
    message still gets its task and reaches the subscriber."""

    async def scenario() -> tuple[int, list[bytes]]:
        async with host_pair() as (a, b):
            pubsub = _CountingPubsub(
                b, GossipSub(protocols=[PROTOCOL_ID_V11], degree=4, degree_low=3, degree_high=8)
            )
            async with background_trio_service(pubsub):
                await pubsub.wait_until_ready()
                subscription = await pubsub.subscribe("t")
                stream = await a.new_stream(b.get_id(), [PROTOCOL_ID_V11])
                first, second = _signed_message(a, b"one", 1), _signed_message(a, b"two", 2)
                got: list[bytes] = []
                for msg in (first, first, first, second):
                    payload = rpc_pb2.RPC(publish=[msg]).SerializeToString()
                    await stream.write(encode_uvarint(len(payload)) + payload)
                    if msg is not first or not got:
                        with trio.fail_after(10):
                            got.append((await subscription.get()).data)
                    else:
                        await trio.sleep(0.3)
                return pubsub.pushed, got

    pushed, got = run(scenario)
    assert got == [b"one", b"two"]
    assert pushed == 2
