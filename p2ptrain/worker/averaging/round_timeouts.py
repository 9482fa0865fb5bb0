"""How long an averaging round may wait, from the network the plan was made for: hivemind's
matchmaking and all-reduce timeouts (step rounds, worker/averaging/stage_averager.py) and the
links' figures outer rounds take theirs from (worker/averaging/outer_group.py). Pure."""

from __future__ import annotations

import dataclasses

from p2ptrain.records import NetworkFacts

RETRY_TIMEOUT_S = 5.0  # a round's second attempt waits at most this

# On shutdown, our last reduced parts may still be on their way to a groupmate: if the process
# left at once, the groupmate's last round would come out partial. Stay this long at most.
MAX_LINGER_S = 2.5


@dataclasses.dataclass(frozen=True)
class AveragingTimeouts:
    """hivemind's matchmaking and all-reduce timeouts for one network (seconds)."""

    request_s: float  # a potential leader must answer a join request within this
    min_matchmaking_s: float  # how long a declared group waits for more peers
    sender_s: float  # max silence between two chunks from one sender
    reducer_s: float  # max wait for one reduced part
    allreduce_s: float  # the whole all-reduce after the group formed
    linger_s: float  # how long to stay after the last round, for our parts to arrive

    @classmethod
    def for_network(
        cls, max_rtt_s: float, min_rate_mbps: float, gradient_bytes: int
    ) -> AveragingTimeouts:
        """Timeouts for links of up to max_rtt_s round trip and at least min_rate_mbps.

        A join request may need a fresh connection (TCP + Noise + muxer: about 4 round trips)
        before its reply; the DHT declare/lookup behind matchmaking takes a few more, so a
        declared group must live several times that. The all-reduce moves, on each peer's
        link, about twice the gradient (its parts out, the averaged parts back)."""
        request_s = max(1.0, 4 * max_rtt_s)
        transfer_s = 2 * gradient_bytes * 8 / (min_rate_mbps * 1e6)
        sender_s = max(5.0, 4 * max_rtt_s + transfer_s)
        return cls(
            request_s=request_s,
            min_matchmaking_s=max(2.0, 2.5 * request_s),
            sender_s=sender_s,
            reducer_s=max(10.0, 2 * sender_s),
            allreduce_s=max(30.0, 8 * max_rtt_s + 4 * transfer_s),
            linger_s=min(MAX_LINGER_S, 2 * max_rtt_s + transfer_s / 2),
        )


LOCAL_TIMEOUTS = AveragingTimeouts(
    request_s=0.5,
    min_matchmaking_s=1.0,
    sender_s=5.0,
    reducer_s=10.0,
    allreduce_s=30.0,
    linger_s=0.0,
)


def averaging_timeouts(
    gradient_bytes: int, network: NetworkFacts | None, stage: int | None = None
) -> AveragingTimeouts:
    """The timeouts for the network the plan was made for: the links of `stage`'s group (the
    ones its rounds cross), or the swarm-wide pair when the stage or its facts are unknown. A
    plan without network facts was made for a local network (loopback or LAN): short
    timeouts, so a failed round is noticed quickly."""
    if network is None:
        return LOCAL_TIMEOUTS
    links = network.swarm if stage is None else network.group(stage)
    return AveragingTimeouts.for_network(links.rtt_s, links.rate_mbps, gradient_bytes)
