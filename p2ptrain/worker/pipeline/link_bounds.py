"""How long the data plane waits on a link, from what the plan says of it (records/plan.py,
NetworkFacts and Plan.link_facts): pipeline frames on their hop, dials on the link to the peer.

Pure (no hivemind), so the rules are unit-testable beside libp2p. Facts of None mean a plan made
for a local network: the local bounds. A slow link only ever stretches a bound, never shortens it:
the local bounds also cover the neighbours' compute and averaging, which no link fact measures.
"""

from __future__ import annotations

from p2ptrain.records import LinkFacts

RECEIVE_TIMEOUT_S = 120.0  # a frame from a neighbour: its compute and averaging, not only the hop
SEND_TIMEOUT_S = 60.0  # a frame to a neighbour, retries included
CONNECT_WINDOW_S = 45.0  # p2pd backs off a failed dial for 5 s and more: try past that
DIAL_ROUND_TRIPS = 40  # a dial on a long link: TCP + Noise + muxer, several tries past backoffs


def frame_waits_s(links: LinkFacts | None, frame_bytes: int) -> tuple[float, float]:
    """(receive, send) bounds for one frame over a hop of these facts: stretched where the
    hop's round trips and rate make the frame itself slow (a retried send pays a few round
    trips and the frame's time at the rate again)."""
    if links is None:
        return RECEIVE_TIMEOUT_S, SEND_TIMEOUT_S
    frame_s = 4 * links.rtt_s + 2 * frame_bytes * 8 / (links.rate_mbps * 1e6)
    return max(RECEIVE_TIMEOUT_S, 2 * frame_s), max(SEND_TIMEOUT_S, frame_s)


def dial_window_s(links: LinkFacts | None) -> float:
    """How long to keep dialling a peer over a link of these facts."""
    if links is None:
        return CONNECT_WINDOW_S
    return max(CONNECT_WINDOW_S, DIAL_ROUND_TRIPS * links.rtt_s)
