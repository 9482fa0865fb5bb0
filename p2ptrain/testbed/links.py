"""What each emulated link does: one-way delay, rate, jitter, loss, up or cut.

Links are directed: (a, b) shapes the packets a sends to b. A topology file gives symmetric
values, so both directions of a pair start out equal; faults may change one direction only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from p2ptrain.errors import UserError

# The default scale turns the paper's 0.3-2 Gbit/s links into 6-40 Mbit/s: small enough for a
# CPU-sized model to be communication-bound, and for a user-space forwarder to keep up.
DEFAULT_BANDWIDTH_SCALE = 0.02
MAX_RATE_MBPS = 1000.0


@dataclass(frozen=True)
class LinkSpec:
    """One direction of one link."""

    delay_ms: float
    rate_mbps: float
    jitter_ms: float = 0.0
    loss: float = 0.0  # probability of dropping each packet, 0..1
    up: bool = True

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise UserError(f"{name} must be a finite number >= 0, got {value!r}")
        if not math.isfinite(self.rate_mbps) or not 0 < self.rate_mbps <= MAX_RATE_MBPS:
            raise UserError(f"rate_mbps must be in (0, {MAX_RATE_MBPS:g}], got {self.rate_mbps!r}")
        if not 0 <= self.loss <= 1:
            raise UserError(f"loss must be in [0, 1], got {self.loss!r}")

    def updated(self, **changes: Any) -> LinkSpec:
        """A copy with the given fields changed (None values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


LinkTable = dict[tuple[int, int], LinkSpec]


def links_from_topology(
    delay_ms: Any,
    bandwidth_gbps: Any,
    *,
    bandwidth_scale: float = DEFAULT_BANDWIDTH_SCALE,
    delay_scale: float = 1.0,
) -> LinkTable:
    """Directed links for every ordered pair of an (N, N) delay/bandwidth matrix.

    rate_mbps = bandwidth_gbps * 1000 * bandwidth_scale; delay_ms = delay_ms * delay_scale.
    """
    if not bandwidth_scale > 0 or not delay_scale >= 0:
        raise UserError("bandwidth scale must be > 0 and delay scale >= 0")
    num_peers = len(delay_ms)
    links: LinkTable = {}
    for a in range(num_peers):
        for b in range(num_peers):
            if a != b:
                links[(a, b)] = LinkSpec(
                    delay_ms=float(delay_ms[a][b]) * delay_scale,
                    rate_mbps=min(
                        float(bandwidth_gbps[a][b]) * 1000.0 * bandwidth_scale, MAX_RATE_MBPS
                    ),
                )
    return links


def configured_rtt_ms(links: LinkTable, a: int, b: int) -> float:
    """Round trip a -> b -> a from the configured one-way delays."""
    return links[(a, b)].delay_ms + links[(b, a)].delay_ms
