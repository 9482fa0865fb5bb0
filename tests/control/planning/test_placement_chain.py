"""One random-placement rule and one chain from the scheduler to the plan: the scheduler's
`Schedule` → control/planning's `Placement` → `records.Plan`."""

from __future__ import annotations

import numpy as np
import pytest

from p2ptrain.control.links import Link
from p2ptrain.control.planning.placement import Placement
from p2ptrain.control.planning.planner import build_matrices, compute_plan
from p2ptrain.records import LinkFacts, NetworkFacts, Plan, RunSpec
from p2ptrain.schedule import Topology, plan_swarm
from p2ptrain.schedule.baselines import random_pipelines

PEERS = [f"p{i}" for i in range(8)]


def _links(seed: int) -> dict[tuple[str, str], Link]:
    rng = np.random.default_rng(seed)
    return {
        (a, b): Link(float(rng.uniform(0.2, 20)), float(rng.uniform(50, 5000)), 0.0)
        for i, a in enumerate(PEERS)
        for b in PEERS[i + 1 :]
    }


@pytest.mark.parametrize("seed", range(5))
def test_the_live_random_placement_keeps_its_seeded_placement(seed: int) -> None:
    """The benchmarks compare random placements by seed: the rule's move into schedule/ must
    deal the same peers as the planner's own deal did (a permutation of the sorted peers,
    pipelines filled row by row, the rest spares)."""
    run = RunSpec().replace(stages=3, placement="random", placement_seed=seed)
    got = compute_plan(build_matrices(list(reversed(PEERS)), _links(1)), run)
    dealt = [sorted(PEERS)[i] for i in np.random.default_rng(seed).permutation(len(PEERS))]
    assert got.pipelines == (tuple(dealt[0:3]), tuple(dealt[3:6]))
    assert got.spares == tuple(sorted(dealt[6:]))


@pytest.mark.parametrize("seed", range(5))
def test_the_schedulers_random_baseline_is_the_live_random_placement(seed: int) -> None:
    """`p2ptrain schedule --algorithm random --seed s` and a run with placement = "random",
    placement_seed = s place the same peers at the same places (before, the scheduler dealt
    its groups column by column: another placement for the same seed)."""
    matrices = build_matrices(PEERS, _links(2))
    live = compute_plan(
        matrices, RunSpec().replace(stages=3, placement="random", placement_seed=seed)
    )
    topology = Topology(
        peers=list(reversed(PEERS)),  # listed in another order: the scheduler sorts them
        delay_ms=matrices.delay_ms[::-1, ::-1],
        bandwidth_gbps=matrices.bandwidth_gbps[::-1, ::-1],
    )
    schedule = plan_swarm(topology, stages=3, replicas=2, seed=seed, algorithm="random")
    placed = Placement.from_schedule(schedule, topology.peers)
    assert placed.pipelines == live.pipelines
    assert sorted(placed.spares) == list(live.spares)  # spares listed in the topology's order


def test_random_pipelines_is_one_seeded_deal() -> None:
    a = random_pipelines(10, 3, 2, np.random.default_rng(7))
    assert a.shape == (2, 3) and len(set(a.ravel().tolist())) == 6
    assert np.array_equal(a, random_pipelines(10, 3, 2, np.random.default_rng(7)))
    assert np.array_equal(a.ravel(), np.random.default_rng(7).permutation(10)[:6])


def test_a_placement_becomes_the_plan_it_describes_and_back() -> None:
    placement = Placement(
        stages=2,
        pipelines=(("p0", "p1"), ("p2", "p3")),
        spares=("p4",),
        cost_s=1.5,
        stage_layers=(3, 1),
        predicted_step_s=0.25,
    )
    addrs = {p: (f"/ip4/127.0.0.1/tcp/{4000 + i}",) for i, p in enumerate(PEERS[:5])}
    network = NetworkFacts(0.01, 100.0, groups=(LinkFacts(0.01, 100.0),) * 2)
    plan = placement.to_plan(
        term=2,
        epoch=5,
        planner="p0",
        data_addrs=addrs,
        network=network,
        lineage=(("0123456789abcdef", 5),),
        reason="members",
        previous_cost_s=None,
    )
    assert isinstance(plan, Plan) and Plan.from_dict(plan.to_dict()) == plan
    assert (plan.term, plan.epoch, plan.reason, plan.network) == (2, 5, "members", network)
    assert Placement.of_plan(plan) == placement
