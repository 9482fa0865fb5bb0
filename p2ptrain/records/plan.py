"""The plan: who trains which stage of which pipeline, and the network it was made for.

Made by the elected planner (control/planning.py) or by a harness that places workers itself;
gossiped inside a signed envelope, handed to the worker over its socket, written to metrics logs.
A plan of term 0 was made without an election (a harness's static plan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from p2ptrain.records import fields as f
from p2ptrain.records import lineage as lin

MAX_STAGES = 1024
MAX_RTT_S = 600.0
# a link's rate in a plan: never 0 (timeouts divide by it), never more than 1 Pbit/s
MIN_RATE_MBPS = 1e-6
MAX_RATE_MBPS = 1e12
MAX_STAGE_LAYERS = 1_000_000  # blocks one stage may hold (a bound for the wire, not a model)


@dataclass(frozen=True)
class LinkFacts:
    """A round trip and a rate: of one link, or the worst of a set of links."""

    rtt_s: float
    rate_mbps: float


def _link_facts(value: object, name: str) -> LinkFacts:
    """One [rtt_s, rate_mbps] pair, within the bounds of NetworkFacts' swarm-wide pair."""
    if not isinstance(value, list) or len(value) != 2:
        raise f.malformed("network", f"{name} must be [rtt_s, rate_mbps] pairs")
    rtt_s = f.number(value[0], "network", f"{name} rtt_s", 0.0, MAX_RTT_S)
    rate = f.number(value[1], "network", f"{name} rate_mbps", MIN_RATE_MBPS, MAX_RATE_MBPS)
    return LinkFacts(rtt_s, rate)


def _pairs(value: object, name: str, max_items: int) -> tuple[LinkFacts, ...]:
    if not isinstance(value, list) or len(value) > max_items:
        raise f.malformed("network", f"{name} must be a list of at most {max_items} pairs")
    return tuple(_link_facts(v, name) for v in value)


@dataclass(frozen=True)
class NetworkFacts:
    """The links the plan's groups use, as measured when it was made: the data plane's timeouts
    derive from them. Absent: the plan was made for a local network (loopback or LAN).

    groups[j]: the worst round trip and rate among stage j's data-parallel group (what its
    averaging and state transfers cross); hops[r][j]: replica r's link from stage j to j + 1
    (what its pipeline frames cross). Both optional (older planners, harness plans): the
    swarm-wide pair stands in for what is missing."""

    max_rtt_s: float  # the slowest round trip between two peers of the plan
    min_rate_mbps: float  # the slowest link between two peers of the plan
    groups: tuple[LinkFacts, ...] = ()
    hops: tuple[tuple[LinkFacts, ...], ...] = ()

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

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"max_rtt_s": self.max_rtt_s, "min_rate_mbps": self.min_rate_mbps}
        if self.groups:
            data["groups"] = [[g.rtt_s, g.rate_mbps] for g in self.groups]
        if self.hops:
            data["hops"] = [[[h.rtt_s, h.rate_mbps] for h in row] for row in self.hops]
        return data

    @classmethod
    def from_dict(cls, data: object) -> NetworkFacts:
        d = f.mapping(data, "network")
        f.require_keys(d, "network", ("max_rtt_s", "min_rate_mbps"))
        rate = f.number(
            d["min_rate_mbps"], "network", "min_rate_mbps", MIN_RATE_MBPS, MAX_RATE_MBPS
        )
        hops = d.get("hops", [])
        if not isinstance(hops, list) or len(hops) > f.MAX_PEERS:
            raise f.malformed("network", f"hops must be a list of at most {f.MAX_PEERS} rows")
        return cls(
            f.number(d["max_rtt_s"], "network", "max_rtt_s", 0.0, MAX_RTT_S),
            rate,
            groups=_pairs(d.get("groups", []), "groups", MAX_STAGES),
            hops=tuple(_pairs(row, "hops", MAX_STAGES - 1) for row in hops),
        )


@dataclass(frozen=True)
class Role:
    """What a plan asks of one peer: which stage of which replica, and its neighbours."""

    term: int  # the plan's (term, epoch): every frame between neighbours names it
    epoch: int
    stage: int
    num_stages: int
    replica: int
    num_replicas: int
    prev_peer: str | None  # sends us activations, receives our gradients
    next_peer: str | None  # receives our activations, sends us gradients
    stage_peers: tuple[str, ...]  # everyone holding our stage, one per replica

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def plan_key(self) -> tuple[int, int]:
        """The (term, epoch) of the plan that gave this role."""
        return self.term, self.epoch


@dataclass(frozen=True)
class Plan:
    """Pipelines list one peer per stage; a replica is one pipeline; spares wait."""

    term: int  # the planner's election term (0: no election)
    epoch: int  # the planner's plan counter within its term
    planner: str  # the planner's peer id, or the name of the harness that placed the peers
    stages: int
    pipelines: tuple[tuple[str, ...], ...]
    spares: tuple[str, ...]
    data_addrs: Mapping[str, tuple[str, ...]]  # peer id -> its data-plane multiaddrs
    cost_s: float  # the scheduler's predicted cost of one step
    network: NetworkFacts | None = None
    # (lineage id, epoch) pairs, newest first: whose stage states it may use (records/lineage.py)
    lineage: lin.Lineage = ()
    # blocks per stage where a compute-aware planner split them unevenly; empty: the model's
    # near-equal cut (layer_ranges), as in older plans and harness plans
    stage_layers: tuple[int, ...] = ()
    # why the planner made it (PLAN_REASONS; "" in older and harness plans), what the plan it
    # replaces costs on the same measurements (the predicted gain is the difference), and the
    # step the planner simulated for it on the measured links and compute (None: not simulated)
    reason: str = ""
    previous_cost_s: float | None = None
    predicted_step_s: float | None = None

    def __post_init__(self) -> None:
        layers = self.stage_layers
        if layers and (len(layers) != self.stages or min(layers) < 1):
            raise ValueError(f"stage_layers {layers} must list >= 1 block for each stage")

    @property
    def key(self) -> tuple[int, int]:
        """Plans order by (term, epoch)."""
        return self.term, self.epoch

    @property
    def num_replicas(self) -> int:
        return len(self.pipelines)

    def peers(self) -> set[str]:
        """Every peer the plan names: pipeline members and spares."""
        return {p for pipeline in self.pipelines for p in pipeline} | set(self.spares)

    def same_placement(self, other: Plan) -> bool:
        """Do both plans put every peer at the same place, on the same layers? (Then a session
        can go on.)"""
        return (
            self.stages == other.stages
            and self.pipelines == other.pipelines
            and self.stage_layers == other.stage_layers
        )

    def layer_problem(self, n_layer: int) -> str | None:
        """Why this plan cannot cut a model of `n_layer` blocks (None: it can)."""
        if self.stages > n_layer:
            return f"{self.stages} stages for {n_layer} layers"
        if self.stage_layers and sum(self.stage_layers) != n_layer:
            return f"stage_layers {list(self.stage_layers)} do not sum to {n_layer} layers"
        return None

    def layer_ranges(self, n_layer: int) -> list[range]:
        """The blocks of each stage: `stage_layers` in order, or (empty) the model's near-equal
        cut, earlier stages taking the remainder (train/model.py). ValueError if the plan does
        not fit the model (layer_problem)."""
        problem = self.layer_problem(n_layer)
        if problem is not None:
            raise ValueError(f"cannot cut the model: {problem}")
        sizes = self.stage_layers or even_layers(n_layer, self.stages)
        ranges, start = [], 0
        for size in sizes:
            ranges.append(range(start, start + size))
            start += size
        return ranges

    def role_of(self, peer_id: str) -> Role | None:
        """This peer's role, or None if the plan leaves it out (a spare, or not named)."""
        for replica, pipeline in enumerate(self.pipelines):
            if peer_id in pipeline:
                stage = pipeline.index(peer_id)
                return Role(
                    term=self.term,
                    epoch=self.epoch,
                    stage=stage,
                    num_stages=self.stages,
                    replica=replica,
                    num_replicas=len(self.pipelines),
                    prev_peer=pipeline[stage - 1] if stage > 0 else None,
                    next_peer=pipeline[stage + 1] if stage + 1 < len(pipeline) else None,
                    stage_peers=tuple(p[stage] for p in self.pipelines),
                )
        return None

    def link_facts(self, a: str, b: str) -> LinkFacts | None:
        """What the plan's network says of the link between peers a and b: their stage group's
        facts if they hold the same stage, the hop's if they are pipeline neighbours, else the
        swarm-wide pair; None for a plan without network facts (a local network)."""
        network = self.network
        if network is None:
            return None
        where = {
            p: (r, j) for r, pipeline in enumerate(self.pipelines) for j, p in enumerate(pipeline)
        }
        if a not in where or b not in where:
            return network.swarm
        (ra, ja), (rb, jb) = where[a], where[b]
        if ja == jb:
            return network.group(ja)
        if ra == rb and abs(ja - jb) == 1:
            return network.hop(ra, min(ja, jb))
        return network.swarm

    @property
    def state_tag(self) -> str | None:
        """The lineage tag of stage states saved under this plan (None: the root, untagged)."""
        return lin.tag_of(self.lineage)

    def state_rank(self, tag: str | None) -> int | None:
        """How close a state of lineage `tag` is to this plan (0: its own lineage), or None if
        the plan must not use it: it was saved in another lineage (a partition's other half)."""
        return lin.rank(self.lineage, tag)

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "term": self.term,
            "epoch": self.epoch,
            "planner": self.planner,
            "stages": self.stages,
            "pipelines": [list(p) for p in self.pipelines],
            "spares": list(self.spares),
            "data_addrs": {peer: list(a) for peer, a in self.data_addrs.items()},
            "cost_s": self.cost_s,
        }
        if self.network is not None:
            data["network"] = self.network.to_dict()
        if self.lineage:
            data["lineage"] = [[entry_id, epoch] for entry_id, epoch in self.lineage]
        if self.stage_layers:
            data["stage_layers"] = list(self.stage_layers)
        if self.reason:
            data["reason"] = self.reason
        if self.previous_cost_s is not None:
            data["previous_cost_s"] = self.previous_cost_s
        if self.predicted_step_s is not None:
            data["predicted_step_s"] = self.predicted_step_s
        return data

    @classmethod
    def from_dict(cls, data: object) -> Plan:
        d = f.mapping(data, "plan")
        required = ("term", "epoch", "planner", "stages", "pipelines", "spares", "data_addrs")
        f.require_keys(d, "plan", (*required, "cost_s"))
        stages = f.integer(d["stages"], "plan", "stages", 1, MAX_STAGES)
        raw_pipelines = d["pipelines"]
        if not isinstance(raw_pipelines, list) or not 0 < len(raw_pipelines) <= f.MAX_PEERS:
            raise f.malformed("plan", "pipelines must be a non-empty list")
        pipelines = tuple(f.peer_ids(p, "plan", "a pipeline") for p in raw_pipelines)
        if any(len(p) != stages for p in pipelines):
            raise f.malformed("plan", "every pipeline must list exactly `stages` peers")
        spares = f.peer_ids(d["spares"], "plan", "spares")
        named = [p for pipeline in pipelines for p in pipeline] + list(spares)
        if len(named) > f.MAX_PEERS:
            raise f.malformed("plan", f"more than {f.MAX_PEERS} peers")
        if len(set(named)) != len(named):
            raise f.malformed("plan", "a peer appears more than once")
        raw_addrs = f.mapping(d["data_addrs"], "plan")
        if len(raw_addrs) > f.MAX_PEERS:
            raise f.malformed("plan", f"data_addrs names more than {f.MAX_PEERS} peers")
        data_addrs = {
            f.peer_id(peer, "plan", "data_addrs key"): f.addrs(a, "plan", "data_addrs")
            for peer, a in raw_addrs.items()
        }
        network = None if d.get("network") is None else NetworkFacts.from_dict(d["network"])
        if network is not None and network.groups and len(network.groups) != stages:
            raise f.malformed("plan", "network.groups must list one pair per stage")
        if (
            network is not None
            and network.hops
            and (
                len(network.hops) != len(pipelines)
                or any(len(h) != stages - 1 for h in network.hops)
            )
        ):
            raise f.malformed("plan", "network.hops must list stages - 1 pairs per pipeline")
        epoch = f.integer(d["epoch"], "plan", "epoch")
        lineage = lin.parse(d.get("lineage", []), "plan")
        if lineage and lineage[0][1] != epoch:
            raise f.malformed("plan", "the lineage's first entry must be at the plan's epoch")
        stage_layers = parse_stage_layers(d.get("stage_layers", []), stages)
        return cls(
            term=f.integer(d["term"], "plan", "term"),
            epoch=epoch,
            planner=f.peer_id(d["planner"], "plan", "planner"),
            stages=stages,
            pipelines=pipelines,
            spares=spares,
            data_addrs=data_addrs,
            cost_s=f.number(d["cost_s"], "plan", "cost_s"),
            network=network,
            lineage=lineage,
            stage_layers=stage_layers,
            reason=parse_reason(d.get("reason", ""), "plan"),
            previous_cost_s=f.optional_number(d.get("previous_cost_s"), "plan", "previous_cost_s"),
            predicted_step_s=f.optional_number(
                d.get("predicted_step_s"), "plan", "predicted_step_s"
            ),
        )


# why a planner published a plan: the first one; the members changed (a join, a leave, a death,
# a peer turned unhealthy); the links drifted; peers' compute was newly measured; only the
# data-plane addresses changed (same placement)
PLAN_REASONS = ("first", "members", "drift", "compute", "addresses")


def parse_reason(value: object, record: str) -> str:
    """A plan's reason: one of PLAN_REASONS, or "" (not said)."""
    return "" if value == "" else f.choice(value, record, "reason", PLAN_REASONS)


def even_layers(n_layer: int, stages: int) -> tuple[int, ...]:
    """The model's own cut: near-equal blocks per stage, earlier stages taking the remainder."""
    base, extra = divmod(n_layer, stages)
    return tuple(base + (1 if j < extra else 0) for j in range(stages))


def parse_stage_layers(value: object, stages: int) -> tuple[int, ...]:
    """Blocks per stage: empty (the even cut) or one integer >= 1 per stage. Their sum is
    checked against the run's n_layer where the run is known (control/view.py, the worker)."""
    if not isinstance(value, list) or len(value) not in (0, stages):
        raise f.malformed("plan", "stage_layers must be empty or list one count per stage")
    return tuple(f.integer(v, "plan", "stage_layers", 1, MAX_STAGE_LAYERS) for v in value)
