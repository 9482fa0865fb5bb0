"""Receive-window credit in batches: a yamux WINDOW_UPDATE once half the window was read.

py-libp2p 0.8.1's yamux stream, after each read, sends a WINDOW_UPDATE whenever the window
stands a little below its target ("partial slack": every other read of a small message, whatever
PY_YAMUX_RELEASE_ON_READ says), and credits the bytes read twice over. Gossip and sync are small
messages on long-lived streams, so on a member of the 32-peer swarm these frames (each encrypted,
sent, read and parsed by the far end) were ~9% of its profile (py-spy, docs/benchmarks.md).

go-yamux's rule instead: count what the application consumed and return it in one update once
it reaches the library's threshold (half the target window). The sender never stalls on it: the
other half of its window stays open while the first is credited back. Bulk streams (the
bandwidth probe) still grow their window: the library's own update runs at each batch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from libp2p.stream_muxer.yamux.yamux import YamuxStream

_Update = Callable[..., Awaitable[None]]


def install() -> None:
    """Batch every yamux stream's credit in this process (idempotent)."""
    library: _Update = YamuxStream._auto_tune_and_send_window_update
    if getattr(library, "_batched", False):
        return

    async def batched(self: Any, *, bytes_read: int = 0) -> None:
        if bytes_read > 0:
            async with self.window_lock:
                self._pending_recv_release += bytes_read
                if self._pending_recv_release < self._grow_threshold():
                    return
        # a batch is due (or a caller's explicit update): the library grows the window back to
        # its target, auto-tunes it and clears the pending count, in one frame
        await library(self, bytes_read=0)

    batched._batched = True  # type: ignore[attr-defined]
    YamuxStream._auto_tune_and_send_window_update = batched  # type: ignore[method-assign]
