"""Per-author, per-kind rate limits on gossip: how many messages of each kind one author may
have us validate, apply and forward. A message past its rate is dropped unforwarded and costs
its author a "flooding" penalty (penalties.py); the view never sees it.

The limits come from what an honest node publishes (control/publishing.py): its record every
6 s, telemetry and claims every 2 s, a plan every 4 s, the run spec and the revocation pages
every 10 s, each kind also at once when it changes, but never within 1 s of the last one of its
kind (NodeState.publish_soon). They count messages by their signed timestamps within a sliding
window, so the order and bunching of delivery do not matter.
"""

from __future__ import annotations

from p2ptrain.control import wire
from p2ptrain.net.ratelimit import StampWindows

WINDOW_S = wire.MAX_CLOCK_SKEW_S  # as old as gossip takes a message (older ones are stale)
# kind -> messages an author may sign within any WINDOW_S. An honest node publishes each kind
# at most once a second (NodeState.publish_soon's floor) and mostly far less: telemetry and
# claims every 2 s (15 a window), plans every 4 s, its record every 6 s, the run every 10 s.
GOSSIP_LIMITS: dict[str, int] = {
    "peer": 40,  # every 6 s, and on each change of address, reachability or worker
    "telemetry": 40,  # every 2 s, and when the worker's health flips
    "claim": 40,  # every 2 s while planner, and at each claim
    "plan": 40,  # every 4 s, and each new plan
    "run": 30,  # every 10 s (the bootstrap), and when it changes
    # up to REVOCATION_PAGES_PER_ROUND (8) pages every 10 s (the bootstrap, publishing.py)
    "revoked": 64,
}
MAX_TRACKED_AUTHORS = 4096  # per kind; the author idle longest is forgotten first


class GossipRates:
    """How many messages of each kind each author signed lately, by their signed timestamps."""

    def __init__(self) -> None:
        self._windows = {
            kind: StampWindows(limit, WINDOW_S, MAX_TRACKED_AUTHORS)
            for kind, limit in GOSSIP_LIMITS.items()
        }

    def allow(
        self,
        author: str,
        kind: str,
        now: float,
        signed_at: float | None = None,
        seq: int | None = None,
    ) -> bool:
        """Count one message of `kind` by `author` at `now`; False past its limit. A message
        (its signed `seq`) counts once: a copy of it replayed by any number of peers, after we
        refused it quietly (its author's record not here yet, a plan we do not follow), costs
        its author nothing more.

        signed_at: the message's signed timestamp (`now` on the same clock: time.time()). The
        pace is the author's, whatever the order of arrival: a node or forwarder stalled on a
        busy machine delivers an honest backlog at once, and a new mesh path delivers older
        messages after newer ones; neither is a flood (counted by arrival, both were: the soak of
        16 control-only peers beside CPU burners blocked honest authors)."""
        windows = self._windows.get(kind)
        return windows is None or windows.allow(author, now, signed_at, seq)
