"""The inbound stream rules every worker protocol shares (worker/inbound.py), over real loopback
sockets: one answer per stream, a refusal for an oversized, cut-short or slow message (its body
never read), and the per-peer count of open streams."""

import asyncio
import logging
import struct

import pytest

from p2ptrain.worker import inbound
from p2ptrain.worker.inbound import Framing, OpenStreams

ACCEPTED, REJECTED = b"\x01", b"\x00"
FRAMING = Framing("test message", struct.Struct(">I"), 16, REJECTED)
LENGTH = FRAMING.length


async def _serve_once(data: bytes, read_timeout_s: float = 2.0) -> tuple[bytes, list[bytes]]:
    """One stream to a handler that reads one length-prefixed header (at most 16 bytes):
    the client's answer and what the handler read."""
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader) -> bytes:
        got.append(await FRAMING.read_header(reader, read_timeout_s))
        return ACCEPTED

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await FRAMING.answer("peer", reader, writer, serve(reader))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(1), 5.0)
        writer.close()
        await writer.wait_closed()
    return answer, got


@pytest.mark.parametrize(
    ("data", "answer", "read"),
    [
        (LENGTH.pack(5) + b"hello", ACCEPTED, [b"hello"]),
        (LENGTH.pack(17) + b"x" * 17, REJECTED, []),  # oversized: refused before its body
        (LENGTH.pack(5) + b"he", REJECTED, []),  # cut short: the slow read times out
    ],
)
def test_one_answer_per_stream(data: bytes, answer: bytes, read: list[bytes]) -> None:
    assert asyncio.run(_serve_once(data, read_timeout_s=0.5)) == (answer, read)


def test_open_streams_are_counted_per_peer_while_served() -> None:
    streams = OpenStreams("test streams")
    with streams.serving("a"), streams.serving("a"), streams.serving("b"):
        assert (streams.of("a"), streams.of("b"), streams.total()) == (2, 1, 3)
    with pytest.raises(RuntimeError), streams.serving("a"):
        raise RuntimeError("a handler failed")
    assert (streams.of("a"), streams.total()) == (0, 0)
    streams.refused("a")
    streams.refused("b")
    assert streams.num_refused == 2


def test_a_flood_of_refused_streams_logs_one_line_in_a_hundred(
    caplog: pytest.LogCaptureFixture,
) -> None:
    streams = OpenStreams("test streams")
    with caplog.at_level(logging.WARNING, logger=inbound.__name__):
        for index in range(250):
            streams.refused(f"peer{index}")
    assert streams.num_refused == 250
    assert [r.getMessage() for r in caplog.records if r.name == inbound.__name__] == [
        "refused test streams, the latest from peer0 (1 so far)",
        "refused test streams, the latest from peer100 (101 so far)",
        "refused test streams, the latest from peer200 (201 so far)",
    ]


def test_a_client_that_stops_reading_holds_no_stream_past_the_linger() -> None:
    """A member asked for a stage state and never read it: the answer's drain waited for good
    (only the read after it had a deadline), and the stream's serving slot with it. Now the
    whole close is bounded, and what is unsent is dropped with the connection (aborted)."""

    async def scenario() -> tuple[float, bool]:
        ended = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"x" * (32 << 20))  # far past the sockets' buffers
            await inbound.close_after_sender(reader, writer, linger_s=0.3)
            ended.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)  # never reads
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(ended.wait(), 10.0)
            took = asyncio.get_running_loop().time() - started
            writer.transport.abort()
        return took, ended.is_set()

    took, ended = asyncio.run(scenario())
    assert ended and took < 3.0


def test_an_unflushed_stream_is_aborted_and_a_flushed_one_closed() -> None:
    calls: list[str] = []

    class Transport:
        def abort(self) -> None:
            calls.append("abort")

    class Writer:
        transport = Transport()

        def close(self) -> None:
            calls.append("close")

    inbound.end_stream(Writer(), flushed=True)  # type: ignore[arg-type]
    inbound.end_stream(Writer(), flushed=False)  # type: ignore[arg-type]
    assert calls == ["close", "abort"]
