"""The network a plan was made for: the round trips and rates of the links its groups use, from
which the data plane's timeouts derive (records/plan.py carries it as `Plan.network`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from p2ptrain.records import fields as f
from p2ptrain.records.codec import Num, Record, Seq, Spec, Wire

MAX_STAGES = 1024  # the stages of a plan (one group's pair per stage)
MAX_RTT_S = 600.0
# a link's rate in a plan: never 0 (timeouts divide by it), never more than 1 Pbit/s
MIN_RATE_MBPS = 1e-6
MAX_RATE_MBPS = 1e12
# groups and hops are left out of the object while empty
OMITTED = Wire(omit_default=True)


@dataclass(frozen=True)
class LinkFacts:
    """A round trip and a rate: of one link, or the worst of a set of links."""

    rtt_s: float
    rate_mbps: float


class LinkPair(Spec):
    """A LinkFacts as [rtt_s, rate_mbps], within the bounds of NetworkFacts' swarm-wide pair."""

    def read(self, value: object, record: str, name: str) -> LinkFacts:
        if not isinstance(value, list) or len(value) != 2:
            raise f.malformed(record, f"{name} must be [rtt_s, rate_mbps] pairs")
        rtt_s = f.number(value[0], record, f"{name} rtt_s", 0.0, MAX_RTT_S)
        rate = f.number(value[1], record, f"{name} rate_mbps", MIN_RATE_MBPS, MAX_RATE_MBPS)
        return LinkFacts(rtt_s, rate)

    def write(self, value: Any) -> Any:
        return [value.rtt_s, value.rate_mbps]


@dataclass(frozen=True)
class NetworkFacts(Record, name="network"):
    """The links the plan's groups use, as measured when it was made: the data plane's timeouts
    derive from them. Absent: the plan was made for a local network (loopback or LAN).

    groups[j]: the worst round trip and rate among stage j's data-parallel group (what its
    averaging and state transfers cross); hops[r][j]: replica r's link from stage j to j + 1
    (what its pipeline frames cross). Both optional (older planners, harness plans): the
    swarm-wide pair stands in for what is missing."""

    # the slowest round trip and the slowest link between two peers of the plan
    max_rtt_s: Annotated[float, Num(0.0, MAX_RTT_S)]
    min_rate_mbps: Annotated[float, Num(MIN_RATE_MBPS, MAX_RATE_MBPS)]
    groups: Annotated[tuple[LinkFacts, ...], Seq(LinkPair(), MAX_STAGES), OMITTED] = ()
    hops: Annotated[
        tuple[tuple[LinkFacts, ...], ...],
        Seq(Seq(LinkPair(), MAX_STAGES - 1), f.MAX_PEERS),
        OMITTED,
    ] = ()

    @property
    def swarm(self) -> LinkFacts:
        """The swarm-wide pair: the bound for any two peers of the plan."""
        return LinkFacts(self.max_rtt_s, self.min_rate_mbps)

    def group(self, stage: int) -> LinkFacts:
        """The links of stage `stage`'s data-parallel group (the swarm-wide pair if unknown)."""
        return self.groups[stage] if 0 <= stage < len(self.groups) else self.swarm

    def hop(self, replica: int, stage: int) -> LinkFacts:
        """Replica `replica`'s link from stage `stage` to `stage + 1` (the swarm-wide pair if
        unknown)."""
        if 0 <= replica < len(self.hops) and 0 <= stage < len(self.hops[replica]):
            return self.hops[replica][stage]
        return self.swarm
