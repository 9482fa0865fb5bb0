"""Access capacity: how fast a peer sends and receives, from the transfers it took part in.

A transfer from a to b runs at most as fast as a's uplink, b's downlink and the path between
them, so every timed transfer (a bandwidth probe, or the worker's byte counters over a busy
interval) is a lower bound on the sender's upload and the receiver's download. The fastest of
the recent ones is the estimate: with a few neighbours, some with faster links than ours, it
closes on the access link itself. A pair nobody measured is then estimated as the bottleneck of
its two ends, in each direction, the slower direction counting (the link matrix is symmetric and
pessimistic: control/links.py). A direct measurement of the pair replaces the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from p2ptrain.records.estimate import AccessCapacity

CAPACITY_WINDOW_S = 600.0  # older transfers are forgotten: a peer's access link may change
NUM_KEPT = 16


@dataclass
class CapacityTracker:
    """This peer's own timed transfers, in each direction; `capacity()` is what it gossips."""

    sent: list[tuple[float, float]] = field(default_factory=list)  # (at, Mbit/s)
    received: list[tuple[float, float]] = field(default_factory=list)

    def observe(self, mbps: float, now: float, sending: bool) -> None:
        """One transfer this peer sent (`sending`) or received, timed at `mbps`."""
        if not mbps > 0:
            return
        kept = self.sent if sending else self.received
        kept.append((now, mbps))
        kept[:] = [s for s in kept if now - s[0] <= CAPACITY_WINDOW_S][-NUM_KEPT:]

    def capacity(self, now: float) -> AccessCapacity:
        def best(kept: list[tuple[float, float]]) -> float | None:
            return max((v for at, v in kept if now - at <= CAPACITY_WINDOW_S), default=None)

        return AccessCapacity(best(self.sent), best(self.received))


def directed_rate(sender: AccessCapacity, receiver: AccessCapacity) -> float | None:
    """The estimated rate from sender to receiver: the narrower of the two ends (an end never
    seen in that direction: taken from its other direction, else unknown)."""
    up = sender.up_mbps if sender.up_mbps is not None else sender.down_mbps
    down = receiver.down_mbps if receiver.down_mbps is not None else receiver.up_mbps
    known = [v for v in (up, down) if v is not None]
    return min(known) if known else None


def pair_rate(a: AccessCapacity, b: AccessCapacity) -> float | None:
    """The estimated rate of the unordered pair: the slower of its two directions."""
    rates = [r for r in (directed_rate(a, b), directed_rate(b, a)) if r is not None]
    return min(rates) if rates else None
