"""How long the data plane waits on a link, from what the plan says of it (records/plan.py,
NetworkFacts and Plan.link_facts): pipeline frames on their hop, dials on the link to the peer.

Pure (no hivemind), so the rules are unit-testable beside libp2p. Facts of None mean a plan made
for a local network: the local bounds. A slow link only ever stretches a bound, never shortens it:
the local bounds also cover the neighbours' compute and averaging, which no link fact measures.
But only so far: link facts come from members' reports (records allow 1e-6 Mbit/s and 600 s
round trips: waits of hundreds of hours, a dead neighbour never declared lost), so they are taken
at MIN_LINK_RATE_MBPS at least and MAX_LINK_RTT_S at most, like state transfers'
(worker/resume/state_transfer.py).
"""

from __future__ import annotations

from p2ptrain.records import LinkFacts

RECEIVE_TIMEOUT_S = 120.0  # a frame from a neighbour: its compute and averaging, not only the hop
SEND_TIMEOUT_S = 60.0  # a frame to a neighbour, retries included
CONNECT_WINDOW_S = 45.0  # p2pd backs off a failed dial for 5 s and more: try past that
DIAL_ROUND_TRIPS = 40  # a dial on a long link: TCP + Noise + muxer, several tries past backoffs
# A slow volunteer uplink's rate: the receiver reads a frame's payload at this rate at least
# anyway (transport.py), so waiting longer for a slower link's frame gains nothing.
MIN_LINK_RATE_MBPS = 1.0
# Past any honest path (a geostationary hop is 0.6 s, a congested one a few seconds): a
# dial window of DIAL_ROUND_TRIPS of it is 200 s at most.
MAX_LINK_RTT_S = 5.0
# The largest frame (frames.MAX_PAYLOAD_BYTES, 512 MiB) at the floor rate and the capped round
# trip waits about 4.8 h to arrive; nothing waits longer than this.
MAX_FRAME_WAIT_S = 6 * 3600.0


def frame_waits_s(links: LinkFacts | None, frame_bytes: int) -> tuple[float, float]:
    """(receive, send) bounds for one frame over a hop of these facts: stretched where the
    hop's round trips and rate make the frame itself slow (a retried send pays a few round
    trips and the frame's time at the rate again); the facts clamped (module doc)."""
    if links is None:
        return RECEIVE_TIMEOUT_S, SEND_TIMEOUT_S
    rate_mbps = max(links.rate_mbps, MIN_LINK_RATE_MBPS)
    frame_s = 4 * min(links.rtt_s, MAX_LINK_RTT_S) + 2 * frame_bytes * 8 / (rate_mbps * 1e6)
    receive_s = min(MAX_FRAME_WAIT_S, max(RECEIVE_TIMEOUT_S, 2 * frame_s))
    return receive_s, min(MAX_FRAME_WAIT_S, max(SEND_TIMEOUT_S, frame_s))


def dial_window_s(links: LinkFacts | None) -> float:
    """How long to keep dialling a peer over a link of these facts (its round trip clamped)."""
    if links is None:
        return CONNECT_WINDOW_S
    return max(CONNECT_WINDOW_S, DIAL_ROUND_TRIPS * min(links.rtt_s, MAX_LINK_RTT_S))
