"""`p2ptrain bench control`: the control plane's logic at 100 to 1,000 peers, simulated
(control_sim.py), judged against the ground truth (control_truth.py).

Per swarm size it runs: the swarm starts, measures its neighbours and settles its coordinates;
the elected planner (real SwarmViews) makes the first plan on estimates as soon as min_peers are
alive and settled (or FIRST_PLAN_WAIT_S passed), measures the plan's links directly and re-plans
if they price it clearly dearer (MAX_CONFIRM_ROUNDS), then commits the cheapest plan it tried;
10% of the peers leave and as many join during the run; the planner is killed and the next
candidate's first plan (a repair of the current placement) ends the failover. The links a plan
rests on are control_bench_plan_links.py's, the judging control_judge.py's, the traffic per peer
control_bench_traffic.py's, the printed table control_bench_report.py's. A run repeats for a
seed, up to the search's CPU time charged to the clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from p2ptrain.control import wire
from p2ptrain.control.authored import INLINE_PLAN_BYTES
from p2ptrain.control.estimate.coordinates import settled
from p2ptrain.control.estimate.matrix import EstimatedMatrices, build_estimated
from p2ptrain.control.planning.confirm import MAX_CONFIRM_ROUNDS
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.harness.control_bench_plan_links import plan_links, with_measured
from p2ptrain.harness.control_bench_traffic import traffic_per_node
from p2ptrain.harness.control_judge import judge, plan_cost_on
from p2ptrain.harness.control_sim import Simulation
from p2ptrain.harness.control_sim_state import SimPeer
from p2ptrain.records import Plan, RunSpec
from p2ptrain.schedule import Topology
from p2ptrain.schedule.planner import plan_swarm
from p2ptrain.schedule.synthetic import paper_workload

STAGES = 8
MIN_PEERS_SHARE = 0.9  # the run's min_peers: most of the starting swarm
CHURN_SHARE = 0.1
FIRST_PLAN_WAIT_S = 90.0  # as control/planning/first_wait.py: plan on what there is by then
REPLAN_IF_WORSE = 1.10  # the plan's measured links cost this much more than estimated: re-plan
SEARCH_EVALUATIONS = 5_000
KILL_AFTER_S = 20.0  # the planner dies this long after its first plan


@dataclass
class PlannerState:
    """The bench's planner duty (what control/planning/plan_maker.py's PlanMaker does live)."""

    first_plan_at: float | None = None
    busy_until: float = -1.0
    plan: Plan | None = None
    estimate: EstimatedMatrices | None = None
    members: list[int] = field(default_factory=list)
    kill_at: float | None = None
    killed: SimPeer | None = None
    failover_s: float | None = None
    search_wall_s: float = 0.0
    estimate_s: float = 0.0
    replanned: int = 0


class ControlBench:
    def __init__(self, num_peers: int, seed: int = 0, horizon_s: float = 240.0) -> None:
        run = RunSpec().replace(
            run_id="bench-control",
            stages=STAGES,
            n_layer=24,
            min_peers=max(2, int(MIN_PEERS_SHARE * num_peers)),
        )
        self.sim = Simulation(num_peers, seed, run)
        self.num_peers, self.seed, self.horizon_s = num_peers, seed, horizon_s
        self.state = PlannerState()
        self.sim.on_planner_tick = self._planner_tick
        self.results: dict[str, Any] = {}
        rng = self.sim.rng
        regular = [p for p in self.sim.peers if p.view is None]
        for peer in rng.sample(regular, int(CHURN_SHARE * num_peers)):
            self.sim.at(rng.uniform(20.0, horizon_s - 20), partial(self.sim.remove_peer, peer))
        for _ in range(int(CHURN_SHARE * num_peers)):
            self.sim.at(rng.uniform(20.0, horizon_s - 20), self._join)

    def _join(self) -> None:
        self.sim.add_peer()

    # ---------------------------------------------------------------- the planner's duty

    def _planner_tick(self, peer: SimPeer) -> None:
        state, sim, view = self.state, self.sim, peer.view
        assert view is not None
        if sim.now < state.busy_until:
            return
        if state.killed is not None and view.plan is not None and view.plan.planner != peer.peer_id:
            self._repair(peer)
            return
        if state.plan is not None:
            return
        members = self._members(peer)
        book = sim.book(peer)
        errors = [book[i][0].error for i in members if i in book]
        waited = sim.now >= FIRST_PLAN_WAIT_S
        if len(members) < sim.run.swarm.min_peers or not (settled(errors) or waited):
            return
        self._plan_first(peer, members)

    def _members(self, peer: SimPeer) -> list[int]:
        assert peer.view is not None
        index = {p.peer_id: p.index for p in self.sim.peers}
        return [index[p] for p in plannable_members(peer.view, self.sim.now)]

    def _estimate(self, peer: SimPeer, members: list[int]) -> EstimatedMatrices:
        assert peer.view is not None
        book = self.sim.book(peer)
        ids = [self.sim.peers[i].peer_id for i in members]
        coords = {self.sim.peers[i].peer_id: book[i][0] for i in members if i in book}
        caps = {self.sim.peers[i].peer_id: book[i][1] for i in members if i in book}
        if peer.index in members:  # its own, fresh
            coords[peer.peer_id] = peer.coord
            caps[peer.peer_id] = peer.capacity.capacity(self.sim.now)
        return build_estimated(ids, coords, caps, peer.view.links.freshest(self.sim.now))

    def _search(self, estimate: EstimatedMatrices, replicas: int) -> tuple[list[list[int]], float]:
        m = estimate.matrices
        topology = Topology(
            list(m.peers), m.delay_ms, m.bandwidth_gbps, workload=paper_workload(STAGES, replicas)
        )
        # the search's CPU time, not its wall time: a busy machine must not slow the simulated
        # planner (the live one searches in a process of its own)
        started = time.process_time()
        plan = plan_swarm(
            topology, STAGES, replicas, seed=self.seed, max_evaluations=SEARCH_EVALUATIONS
        )
        wall = time.process_time() - started
        self.state.search_wall_s += wall
        return plan.pipelines, wall

    def _plan_first(self, peer: SimPeer, members: list[int]) -> None:
        state, sim = self.state, self.sim
        replicas = len(members) // STAGES
        started = time.process_time()  # the fit of the estimate (control/estimate/fit.py)
        estimate = self._estimate(peer, members)
        fit_s = time.process_time() - started
        pipelines, wall = self._search(estimate, replicas)
        # the estimate's and the search's own time passes in the simulation too
        state.busy_until = sim.now + fit_s + wall
        state.estimate_s = fit_s
        sim.at(state.busy_until, lambda: self._confirm(peer, members, estimate, pipelines))

    def _confirm(
        self,
        peer: SimPeer,
        members: list[int],
        estimate: EstimatedMatrices,
        pipelines: list[list[int]],
        round_: int = 1,
        tried: tuple[list[list[int]], ...] = (),
    ) -> None:
        """Measure the plan's links directly; re-plan (and confirm again, MAX_CONFIRM_ROUNDS
        at most) if they price it clearly worse than estimated. Then commit the cheapest of the
        plans `tried`, priced on every link measured so far: a re-plan is no better for being
        the latest (as live, where it replaces the plan only if it pays: placement.SWITCH_GAIN)."""
        sim, state = self.sim, self.state
        tried = (*tried, pipelines)
        links = plan_links(pipelines)
        slowest = 0.0
        for a, b in links:
            end_a, end_b = sim.peers[members[a]], sim.peers[members[b]]
            sim.probes.measure_rtt(end_a, end_b)
            sim.probes.measure_rate(end_a, end_b)
            sim.probes.measure_rate(end_b, end_a)
            slowest = max(slowest, sim.truth.rtt_ms(end_a.index, end_b.index))
        for a in {x for pair in links for x in pair}:  # partners join their neighbour sets
            sim.peers[members[a]].partners = tuple(
                members[b if a == x else x] for x, b in links if a in (x, b)
            )[:4]
        confirmed = with_measured(sim.peers, estimate, members, links)
        workload = paper_workload(STAGES, len(pipelines))
        predicted = self._cost(estimate, pipelines, workload)
        measured = self._cost(confirmed, pipelines, workload)
        wait = 2.0 + 4 * slowest / 1e3  # a round trip and a rate probe per link, all at once
        if measured > REPLAN_IF_WORSE * predicted and round_ < MAX_CONFIRM_ROUNDS:
            pipelines, wall = self._search(confirmed, len(pipelines))
            state.replanned += 1
            state.busy_until = sim.now + wait + wall
            sim.at(
                state.busy_until,
                partial(self._confirm, peer, members, confirmed, pipelines, round_ + 1, tried),
            )
            return
        pipelines = min(tried, key=lambda p: self._cost(confirmed, p, workload))
        state.estimate = confirmed
        state.busy_until = sim.now + wait
        sim.at(state.busy_until, lambda: self._commit(peer, members, pipelines))

    @staticmethod
    def _cost(estimate: EstimatedMatrices, pipelines: list[list[int]], workload: Any) -> float:
        return plan_cost_on(estimate, pipelines, workload)

    def _commit(self, peer: SimPeer, members: list[int], pipelines: list[list[int]]) -> None:
        sim, state = self.sim, self.state
        view = peer.view
        assert view is not None
        if view.planner != peer.peer_id:
            return
        ids = [sim.peers[i].peer_id for i in members]
        placed = {p for pipe in pipelines for p in pipe}
        plan = Plan(
            term=view.term,
            epoch=1,
            planner=peer.peer_id,
            stages=STAGES,
            pipelines=tuple(tuple(ids[p] for p in pipe) for pipe in pipelines),
            spares=tuple(ids[i] for i in range(len(ids)) if i not in placed),
            data_addrs={p: (f"/ip4/203.0.113.9/tcp/4002/p2p/{p}",) for p in ids},
            cost_s=1.0,
        )
        view.adopt_own_plan(plan)
        arrives_s = sim.cadences.send_plan(plan)
        sim.deliver_plan(peer, plan)
        state.plan, state.members = plan, members
        state.first_plan_at = sim.now + arrives_s
        state.kill_at = state.first_plan_at + KILL_AFTER_S
        sim.at(state.kill_at, lambda: self._kill(peer))
        self._judge(pipelines)

    def _kill(self, peer: SimPeer) -> None:
        self.state.killed = peer
        self.sim.remove_peer(peer)

    def _repair(self, peer: SimPeer) -> None:
        """The new planner's first plan: the current placement, dead peers swapped for spares."""
        sim, state, view = self.sim, self.state, peer.view
        assert view is not None and view.plan is not None and state.kill_at is not None
        if state.failover_s is not None:
            return
        alive = set(plannable_members(view, sim.now))
        spares = [p for p in view.plan.spares if p in alive]
        pipelines = tuple(
            tuple(p if p in alive else (spares.pop() if spares else p) for p in pipe)
            for pipe in view.plan.pipelines
        )
        plan = Plan(
            term=view.term,
            epoch=1,
            planner=peer.peer_id,
            stages=view.plan.stages,
            pipelines=pipelines,
            spares=tuple(spares),
            data_addrs=view.plan.data_addrs,
            cost_s=view.plan.cost_s,
        )
        previous = view.plan
        view.adopt_own_plan(plan)
        arrives_s = sim.cadences.send_plan(plan, previous)  # every peer holds the last plan
        sim.deliver_plan(peer, plan)
        state.failover_s = sim.now + arrives_s - state.kill_at

    # ---------------------------------------------------------------- judging

    def _judge(self, pipelines: list[list[int]]) -> None:
        """Estimates against the truth, and the plan made on them against the plan made on it."""
        assert self.state.estimate is not None
        self.results.update(
            judge(
                self.sim.truth,
                self.state.estimate,
                self.state.members,
                pipelines,
                self.seed,
                STAGES,
                SEARCH_EVALUATIONS,
            )
        )

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        sim, state = self.sim, self.state
        rtt_ms, rate_mbps = sim.truth.matrices(list(range(min(200, len(sim.peers)))))
        sim.median_one_way_s = float(np.median(rtt_ms)) / 2e3
        sim.median_rate_mbps = float(np.median(rate_mbps[rate_mbps > 0]))
        sim.run_until(self.horizon_s, stop=lambda: state.failover_s is not None)
        end = sim.now
        neighbour_sizes = [len(p.neighbours) for p in sim.peers if p.alive]
        return {
            "peers": self.num_peers,
            **traffic_per_node(sim, end),
            "first_plan_s": None if state.first_plan_at is None else round(state.first_plan_at, 2),
            "rtt_error": self.results.get("rtt_error"),
            "rate_error": self.results.get("rate_error"),
            "plan_cost_ratio": self.results.get("plan_cost_ratio"),
            "failover_s": None if state.failover_s is None else round(state.failover_s, 2),
            "measured_links": self.results.get("measured_links"),
            "replans_after_confirming": state.replanned,
            "error_breakdown": self.results.get("error_breakdown"),
            "estimate_s": round(state.estimate_s, 2),
            "neighbours_max": max(neighbour_sizes, default=0),
            "telemetry_bytes": sim.sizes["telemetry_base"] + 12 * sim.sizes["telemetry_link"],
            "plan_bytes": sim.plan_bytes(state.plan) if state.plan else None,
            # gossip carries a plan in one 64 KiB envelope (control/wire.py); a larger one is
            # named by the claims and pulled hop by hop (control/plan_pull.py)
            "plan_fits_envelope": state.plan is not None
            and sim.plan_bytes(state.plan) <= wire.MAX_ENVELOPE_BYTES,
            "plan_pulled": state.plan is not None
            and sim.plan_bytes(state.plan) > INLINE_PLAN_BYTES,
            "simulated_s": round(end, 1),
            "search_wall_s": round(state.search_wall_s, 2),
            "wall_s": round(time.perf_counter() - started, 1),
        }


def run_benchmark(sizes: list[int], seed: int = 0, horizon_s: float = 240.0) -> dict[str, Any]:
    return {"runs": [ControlBench(n, seed, horizon_s).run() for n in sizes]}
