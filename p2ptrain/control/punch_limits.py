"""How many hole punches a NATed node runs at once, how often, and to which endpoints: each
way (taking offers; our own dials) alike.

A punch sends SYNs at an endpoint a relay reported, so these limits keep a hostile relay or a
flood of offers from making us a SYN source. They stand apart from the punches themselves
(control/traversal.py) as bookkeeping that needs no connection, the same for either direction.
"""

from __future__ import annotations

from p2ptrain.net.ratelimit import WindowLimiter
from p2ptrain.records.relay import MIN_PUNCH_PORT
from p2ptrain.records.relay import split_endpoint as relay_split

# punches at once, each way (taking offers; our own dials): a punch sends SYNs at an endpoint
# others reported, so a flood of offers must not make us a SYN source. One per peer and plane.
MAX_PUNCHES = 8
# A punch's endpoint is a relay's word (the dialer asks the relays a target's own record names;
# `vouch` is all that ties it to the peer): a hostile one aims punches anywhere. So, each way:
# no port below MIN_PUNCH_PORT, a rate per peer and in all, and an endpoint punched once per
# ENDPOINT_BACKOFF_S unless its far end proved to be the peer. Honest rates: a route connection
# punches at most once (a punch that connected carries it, one that failed stops punches to
# that peer for PUNCH_RETRY_S: control/traversal.py), a plane redials a member every 10 s at
# most (discovery's REDIAL_BACKOFF_S, py-libp2p's 3 tries): 2 a peer while connections hold (one
# a plane), ~36 a minute in a storm of dropped ones; and each punch observes a fresh port, so an
# honest endpoint is never punched twice
PUNCH_WINDOW_S = 60.0
PUNCHES_PER_PEER = 60  # a window, each way
PUNCHES_IN_ALL = 256  # a window, each way: every route (routes.py: MAX_ROUTES) once a minute
ENDPOINT_BACKOFF_S = 600.0
MAX_BACKED_OFF = 4096  # endpoints remembered each way, the oldest out first


def may_punch(punching: set[tuple[str, str]], key: tuple[str, str]) -> bool:
    """May we start a punch for `key` (peer, plane), `punching` those running one way now?"""
    return key not in punching and len(punching) < MAX_PUNCHES


class PunchLimits:
    """One direction's punches: the rate per peer and in all, and endpoints backed off."""

    def __init__(self) -> None:
        self.rate = WindowLimiter(PUNCHES_PER_PEER, PUNCHES_IN_ALL, PUNCH_WINDOW_S)
        self.unproven: dict[str, float] = {}  # endpoint -> when punched, oldest first

    def refusal(self, peer: str, endpoint: str, now: float) -> str:
        """'' if we may punch `endpoint` for `peer` now (counted, and backed off until
        `proven`), else why not."""
        if relay_split(endpoint)[1] < MIN_PUNCH_PORT:
            return f"{endpoint} is below port {MIN_PUNCH_PORT}"
        if now - self.unproven.get(endpoint, -ENDPOINT_BACKOFF_S) < ENDPOINT_BACKOFF_S:
            return f"{endpoint} was punched lately and never proved to be the peer"
        if not self.rate.allow(peer, now):
            return "punching as often as we may"
        self.unproven.pop(endpoint, None)
        self.unproven[endpoint] = now
        while self.unproven and (
            len(self.unproven) > MAX_BACKED_OFF
            or now - next(iter(self.unproven.values())) >= ENDPOINT_BACKOFF_S
        ):
            del self.unproven[next(iter(self.unproven))]
        return ""

    def proven(self, endpoint: str) -> None:  # its far end showed the offer's token
        self.unproven.pop(endpoint, None)
