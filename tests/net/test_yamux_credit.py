"""Yamux credit in batches (net/yamux_credit.py), between two live py-libp2p hosts on loopback:
many small messages draw no window update per message, and a transfer larger than the window
still completes (its credit comes back in half-window batches)."""

from __future__ import annotations

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.stream_muxer.yamux.yamux import DEFAULT_WINDOW_SIZE, YamuxStream

from tests.net.test_protocols import host_pair
from tests.net.trio_run import run

SINK = TProtocol("/test/sink/1.0.0")


def _received_and_updates(message_bytes: int, num_messages: int) -> tuple[int, int]:
    """Send `num_messages` writes of `message_bytes` on one stream; what the far end read, and
    how many window updates it sent back."""
    updates = 0
    library = YamuxStream.send_window_update

    async def counted(self: YamuxStream, *args: object, **kwargs: object) -> None:
        nonlocal updates
        updates += 1
        await library(self, *args, **kwargs)  # type: ignore[arg-type]

    async def scenario() -> int:
        received = 0
        done = trio.Event()

        async def sink(stream: object) -> None:
            nonlocal received
            while True:
                try:
                    chunk = await stream.read(65536)  # type: ignore[attr-defined]
                except StreamEOF:
                    break
                if not chunk:
                    break
                received += len(chunk)
            done.set()

        async with host_pair() as (a, b):
            b.set_stream_handler(SINK, sink)
            stream = await a.new_stream(b.get_id(), [SINK])
            for _ in range(num_messages):
                await stream.write(b"x" * message_bytes)
                await trio.sleep(0.001)  # one message per read, as gossip arrives
            await stream.close()
            with trio.fail_after(30):
                await done.wait()
        return received

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(YamuxStream, "send_window_update", counted)
        received = run(scenario)
    return received, updates


def test_small_messages_draw_no_update_per_message() -> None:
    num_messages, message_bytes = 200, 400  # 80 kB: under half the window
    assert num_messages * message_bytes < DEFAULT_WINDOW_SIZE // 2
    received, updates = _received_and_updates(message_bytes, num_messages)
    assert received == num_messages * message_bytes
    assert updates <= 2  # py-libp2p's own rule sent ~100 here


def test_a_transfer_past_the_window_completes() -> None:
    num_messages, message_bytes = 64, 16 * 1024  # 1 MiB: four windows
    received, updates = _received_and_updates(message_bytes, num_messages)
    assert received == num_messages * message_bytes
    assert 1 <= updates <= 2 * num_messages * message_bytes // DEFAULT_WINDOW_SIZE + 2
