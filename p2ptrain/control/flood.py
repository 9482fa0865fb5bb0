"""Per-author, per-kind rate limits on gossip: how many messages of each kind one author may
have us validate, apply and forward. A message past its rate is dropped unforwarded and costs
its author a "flooding" penalty (penalties.py); the view never sees it.

The rates come from what an honest node publishes (control/publishing.py): its record every 6 s,
telemetry and claims every 2 s, a plan every 4 s, the run spec and the revocation pages every
10 s, each kind also at once when it changes, but never within 1 s of the last one of its kind
(NodeState.publish_soon). Each rate
below is about four times the periodic one, and each burst covers a kind announced at once
several times in a row plus what gossip's IWANT replays deliver together.
"""

from __future__ import annotations

from p2ptrain.control import wire
from p2ptrain.net.ratelimit import TokenBuckets

# kind -> (messages per second, burst)
GOSSIP_RATES: dict[str, tuple[float, float]] = {
    "peer": (1.0, 8.0),  # every 6 s, and on each change of address, reachability or worker
    "telemetry": (2.0, 8.0),  # every 2 s, and when the worker's health flips
    "claim": (2.0, 8.0),  # every 2 s while planner
    "plan": (2.0, 8.0),  # every 4 s, and each new plan (the planner ticks every 0.5 s)
    "run": (1.0, 8.0),  # every 10 s (the bootstrap)
    # up to REVOCATION_PAGES_PER_ROUND pages every 10 s (the bootstrap, publishing.py)
    "revoked": (2.0, 16.0),
}
MAX_TRACKED_AUTHORS = 4096  # per kind; the author idle longest is forgotten first


class GossipRates:
    """A token bucket per author for each kind of message."""

    def __init__(self) -> None:
        self._buckets = {
            # a node that meets an author for the first time may get a backlog as old as
            # gossip keeps messages (wire.MAX_CLOCK_SKEW_S): an overloaded node's first contact
            kind: TokenBuckets(rate, burst, MAX_TRACKED_AUTHORS, wire.MAX_CLOCK_SKEW_S)
            for kind, (rate, burst) in GOSSIP_RATES.items()
        }

    def allow(self, author: str, kind: str, now: float, signed_at: float | None = None) -> bool:
        """Count one message of `kind` by `author` at `now`; False past its rate.

        signed_at: the message's signed timestamp (`now` on the same clock: time.time()). The
        pace is then the author's, not the arrival's: a node or forwarder stalled on a busy
        machine delivers an honest backlog at once, and that must not read as a flood (it did:
        the soak of 16 control-only peers beside CPU burners blocked honest authors)."""
        buckets = self._buckets.get(kind)
        return buckets is None or buckets.allow(author, now, signed_at)
