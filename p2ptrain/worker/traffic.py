"""Data-plane byte counters of one worker: in total and per peer, since the worker started.

What is counted is application bytes, the payloads our protocols write and read (pipeline frames
with their headers, averaging parts and metadata as hivemind serialises them, stage-state
requests and files), not what TCP, Noise and yamux add around them. Every data-plane path adds
to the worker's one `Traffic` (the transport owns it); the averager's process sends its counts
back after each round (worker/averaging/planned_group.py). Stdlib only.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from p2ptrain.records import LinkBytes
from p2ptrain.records.fields import MAX_PEERS


class Traffic:
    """Cumulative bytes sent to and received from each peer (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[str, tuple[int, int]] = {}  # peer id -> (sent, received)

    def sent(self, peer_id: str, num_bytes: int) -> None:
        self.add({peer_id: (num_bytes, 0)})

    def received(self, peer_id: str, num_bytes: int) -> None:
        self.add({peer_id: (0, num_bytes)})

    def add(self, counts: Mapping[str, tuple[int, int]]) -> None:
        """Add (sent, received) bytes per peer."""
        with self._lock:
            for peer, (sent, received) in counts.items():
                old_sent, old_received = self._links.get(peer, (0, 0))
                self._links[peer] = (old_sent + sent, old_received + received)

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return sum(sent for sent, _ in self._links.values())

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return sum(received for _, received in self._links.values())

    def link_bytes(self) -> dict[str, LinkBytes]:
        """The counters per peer, as MetricsReport carries them (the MAX_PEERS busiest links,
        which a report may carry, in a swarm where we met more peers over time)."""
        with self._lock:
            links = sorted(self._links.items(), key=lambda item: -sum(item[1]))[:MAX_PEERS]
        return {peer: LinkBytes(s, r) for peer, (s, r) in sorted(links)}
