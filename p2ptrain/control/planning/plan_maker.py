"""The elected planner's duty: decide when the swarm gets a new plan, and make it.

A new placement restarts every training session in the swarm (checkpoint, agree on a step,
reload), so plans change only when they must or when it clearly pays:
- never before the run's `min_peers` are alive (the first plan waits for the expected swarm;
  a planner that takes over a run under way, whose plan it or the organiser saw, does not:
  SwarmView.run_planned);
- only peers that are alive and healthy (control/health.py): an unhealthy one counts as gone;
  a peer that says it stops while it alone holds a stage stays one plan longer as a spare, a
  donor of its state (control/handover.py);
- on a membership change, after a short debounce (a burst of joins gives one plan);
- on measurement drift, only if the new placement beats the current one, priced on the same new
  measurements, by placement.SWITCH_GAIN (and never for a random placement: a baseline keeps its
  placement until membership changes), and not within DRIFT_DWELL_S of the last plan: on noisy
  links a fresh search always beats the current placement priced on the new noise (32 peers
  on one machine switched every 10 s); a drift whose search found nothing worth switching to
  doubles the wait for the next check (up to MAX_DRIFT_CHECK_INTERVAL_S, reset by a plan): on
  noisy links every check "drifted", each a search (8% of a core at 32 peers);
- the same placement is re-issued as a new epoch when a member's data-plane addresses changed,
  or without a donor gone without a word or past its time (its announcement is not waited
  for; one that says it exits, its hand-over done, is left for the next plan to drop);
- when a member's first measured stage time arrives (compute-aware runs: workers time the model
  once they have the run spec, which comes with the first plan), like drift: only if it pays;
- never once the run is finished (its last step trained: control/run_end.py), whoever is left;
- once a placed replica trained the run's last step (the run ends: each replica finishes at its
  own pace under diloco), only when a placed peer is lost before its last step, and without the
  done peers: a done peer that leaves is done, not lost, and nothing else (a join, drift, a new
  planner's first tick) restarts replicas about to finish.
The numbers (the live matrices, a plan's price) and the search are the planning child's, asked
for only when a decision is due (numbers.py; drift is judged on the links, and watched for
after each plan, in drift.py).
"""

from __future__ import annotations

import logging
import math

from p2ptrain.control.handover import Donors
from p2ptrain.control.links import Link
from p2ptrain.control.planning import search_process
from p2ptrain.control.planning.confirm import PlanConfirmation
from p2ptrain.control.planning.drift import DriftWatch
from p2ptrain.control.planning.first_wait import FirstPlanWait
from p2ptrain.control.planning.numbers import PlanInputs, Searched
from p2ptrain.control.planning.placement import (
    Placement,
    plan_lineage,
    publishable,
    worth_switching,
)
from p2ptrain.control.planning.plan_inputs import (
    data_addrs_of,
    plan_inputs_of,
    plannable_members,
    roles_of,
    saved_states,
    stage_computes,
    unroutable,
)
from p2ptrain.control.planning.readiness import first_plan_gaps, holder_gaps
from p2ptrain.control.planning.silent_start import SilentStart
from p2ptrain.control.planning.trust import ComputeTrust, compute_known, measured_peers
from p2ptrain.control.run_end import lost_before_end, steps_left
from p2ptrain.control.view import SwarmView
from p2ptrain.records import Plan, RunSpec, StageCompute

log = logging.getLogger(__name__)

PLAN_DEBOUNCE_S = 1.5
MIN_STEPS_AFTER_SWITCH = 10  # a drift or compute re-plan needs this many steps left to pay


def min_steps_to_switch(run: RunSpec) -> int:
    """A new placement restarts every session (resume, state transfer): near the run's end
    it cannot pay (bench scaleout run 8: a drift re-plan one step before the end stopped the
    last outer round and held the run's end up for 5 minutes)."""
    return max(MIN_STEPS_AFTER_SWITCH, run.optim.steps // 5)


class PlanMaker:
    """State of the planner role on this node: the epoch counter and what the last plan saw."""

    def __init__(self, view: SwarmView, peer_id: str) -> None:
        self.view = view
        self.peer_id = peer_id
        self._term = 0
        self._epoch = 0
        self._planned_members: list[str] | None = None
        self._donors = Donors()  # stopping peers our plans keep as spares: control/handover.py
        self._planned_measured: frozenset[str] = frozenset()
        self._change_since: float | None = None
        self._waiting_logged = 0
        self._refused = ""  # why the last search found no placement that fits (logged once)
        self._first_wait = FirstPlanWait()
        self._trust = ComputeTrust()  # claimed compute checked against observed steps
        self._silent = SilentStart()  # members the others never heard in a start agreement
        self._confirmation = PlanConfirmation()  # a plan made on estimated links
        self._drift = DriftWatch()  # the last plan's links, and when to compare them again

    async def tick(
        self,
        now: float,
        own_data_addrs: list[str],
        own_reachability: str = "unknown",
        own_relays: tuple[str, ...] = (),
    ) -> bool:
        """Publish a new plan into the view if one is due; True if it did. own_reachability and
        own_relays: this node's dial-back verdict and relay slots (the view holds the others')."""
        members = plannable_members(self.view, now)
        if not members or self.view.run is None or self.view.finished:
            return False  # nothing to plan for: no peer, no run, or a run trained to its end
        if self.view.own_health.leaving:
            return False  # we stop, and a planner that stays is elected (candidacy.stays)
        run = self.view.run
        if self._term != self.view.term:
            self._term, self._epoch, self._planned_members = self.view.term, 0, None
        current = self.view.plan
        run_end = self.view.run_end
        done = run_end.done_in(run, current)
        if current is not None and done and not lost_before_end(current, members, done):
            return False  # the run ends under this plan: no loss to re-plan
        trained = run_end.done_of(run)  # their workers exit: never placed again
        reported = {peer: m.metrics for peer, m in self.view.members.items()}
        reported[self.view.self_id] = self.view.own_metrics
        members = [peer for peer in members if peer not in trained]
        members = self._silent.admit(current, members, reported, now)  # silent in its start
        if not members:
            return False
        donors, gone = self._donors.review(self.view, current, members, now)
        donors = [peer for peer in donors if not self._silent.is_out(peer)]  # no donor either
        first = current is None and not self.view.run_planned  # a plan was out: not the first
        if first and len(members) < run.swarm.min_peers:
            if self._waiting_logged != len(members):
                self._waiting_logged = len(members)
                log.info(
                    "waiting for peers before the first plan: %d of %d alive",
                    len(members),
                    run.swarm.min_peers,
                )
            return False
        measured = stage_computes(self.view, members)
        links = self.view.links.freshest(now)
        data_addrs = data_addrs_of(self.view, members + donors, own_data_addrs)
        private = unroutable(self.view, members, own_reachability, own_relays)
        if current is None and self._awaits_first_plan(
            now, members, data_addrs, links, measured, private
        ):
            search_process.warm()  # its start overlaps the wait, not the first plan's search
            return False
        repriced = self._trust.observe(current, reported, now)
        inputs = plan_inputs_of(
            self.view, now, members, links, measured, private, self._trust.factors, run
        )
        newly_measured = compute_known(members, measured, run) and not (
            measured_peers(members, measured) <= self._planned_measured
        )
        price_due = self._confirmation.pricing_due(now, current, links, members)
        searched: Searched | None = None
        reissued = False  # the current placement published again (addresses, a donor gone)
        previous_cost_s: float | None = None  # the current plan on the same measurements
        if members == self._planned_members:
            self._change_since = None  # a flap back within the debounce: nothing to re-plan
        if members != self._planned_members:
            if self._change_since is None:
                self._change_since = now
            if now - self._change_since < PLAN_DEBOUNCE_S:
                return False
            reason = "first" if current is None else "members"
            searched = await self._search(inputs, None, current)
            if price_due and current is not None and searched is not None:
                self._confirmation.judge(now, current, searched.plan_cost_s)  # learns optimism
        # drift re-plans a scheduled placement only: a random one (the benchmarks' baseline)
        # stays as it is until membership changes
        elif run.swarm.placement == "scheduled" and (
            (drifted := self._drift.drifted(now, links, self._planned_members, self.view.plan))
            or newly_measured
            or repriced
            or price_due
        ):
            matrices, confirm = None, False
            if price_due and current is not None:  # the plan priced on its measured links
                try:
                    assessment = await search_process.assess(inputs, current)
                except Exception:  # a bug in the child's numbers must not take the node down
                    log.exception("pricing the plan on %d peers failed", len(members))
                    self._confirmation.judge(now, current, None)  # not again for this plan
                    return False
                confirm = self._confirmation.judge(now, current, assessment.plan_cost_s)
                matrices = assessment.matrices
            if not (drifted or newly_measured or repriced or confirm):
                return False
            reason = "compute" if newly_measured or repriced else "drift"
            self._planned_measured = measured_peers(members, measured)
            searched = await self._search(inputs, matrices, current)
            previous_cost_s = None if searched is None or current is None else searched.plan_cost_s
            optimism = self._confirmation.optimism(now)
            if (
                searched is not None
                and searched.placement is not None
                and not self._pays_to_switch(
                    searched.placement, current, previous_cost_s, run, optimism
                )
            ):
                self._drift.rebase(links)
                if reason == "drift":
                    self._drift.back_off()
                    # the next check is twice the interval away: the child (93 MiB with scipy)
                    # need not idle until then; a change meanwhile starts another
                    await search_process.release()
                return False
        elif (
            current is not None
            and current.planner == self.peer_id
            and ({p: dict(current.data_addrs).get(p) for p in data_addrs} != data_addrs or gone)
        ):
            reason = "members" if gone else "addresses"  # a donor gone: the plan's members
            previous_cost_s, reissued = current.cost_s, True
        else:
            return False
        self._change_since = None
        if searched is not None:
            placement, network = searched.placement, searched.network
        elif current is not None and reissued:
            # the same placement re-issued keeps the network it was timed for
            # without the spares that are neither members nor donors: donors gone or done
            dropped = set(current.spares) - set(members) - set(donors)
            placement, network = Placement.of_plan(current).without(dropped), current.network
        else:
            return False  # the scheduler failed (logged)
        if placement is None or self.view.planner != self.peer_id or self.view.term != self._term:
            return False  # no placement fits, or we lost the role while the search ran
        placement = placement.with_spares(donors, self._donors.blocks_of(donors))
        self._epoch += 1
        self._planned_members = members
        self._donors.kept(donors, now)
        self._drift.planned(links, now)
        self._confirmation.note(members, placement.pipelines, links, now)
        self._planned_measured = measured_peers(members, measured)
        plan = placement.to_plan(
            term=self._term,
            epoch=self._epoch,
            planner=self.peer_id,
            data_addrs=data_addrs,
            network=network,
            lineage=plan_lineage(current, self._term, self._epoch, self.peer_id),
            reason=reason,
            previous_cost_s=previous_cost_s,
        )
        checked = publishable(plan)  # as receivers decode it
        if checked is None:
            return False  # a bug (logged): every receiver would refuse it and blame us
        self.view.adopt_own_plan(checked)
        log.info(
            "published plan term %d epoch %d: %d peers, %d pipelines x %d stages, cost %.3f s%s",
            self._term,
            self._epoch,
            len(members),
            plan.num_replicas,
            plan.stages,
            plan.cost_s,
            f" ({searched.summary})" if searched is not None else "",
        )
        return True

    def next_deadline(self, now: float) -> float:
        """When `tick` may decide otherwise with nothing new arriving: the debounce of a
        membership change ends (the election wakes for it: control/election.py)."""
        if self._change_since is None:
            return math.inf
        return self._change_since + PLAN_DEBOUNCE_S

    def _pays_to_switch(
        self,
        placement: Placement,
        current: Plan | None,
        current_cost: float | None,
        run: RunSpec,
        optimism: float = 1.0,
    ) -> bool:
        """Is `placement` worth a restart over `current`, which costs `current_cost` a step on
        the same measurements? Compared per token, as the search compares shapes: under diloco
        each replica adds its own batch, so 4 replicas at 0.97 s a step are no faster than 8
        at 2.0 s (bench scaleout run 8 restarted 8 x 1 as 4 x 1 on a per-step comparison).
        The new placement's predicted cost counts `optimism` times (control/planning/confirm.py:
        how much dearer than predicted our last confirmed plan proved)."""
        if current is None:
            return True
        same_layers = placement.stage_layers == current.stage_layers
        if placement.pipelines == current.pipelines and same_layers:
            return False  # same placement: nothing to restart for
        left = steps_left(self.view.members, run, current)
        if left is not None and left < min_steps_to_switch(run):
            log.info("keeping the current placement: %d steps left of the run", left)
            return False
        new_tokens = run.tokens_per_step(len(placement.pipelines))
        current_tokens = run.tokens_per_step(len(current.pipelines))
        switch = worth_switching(
            placement.cost_s * optimism / new_tokens,
            None if current_cost is None else current_cost / current_tokens,
        )
        log.info(
            "measurements drifted: new placement %.3f s a step for %d tokens%s vs current %s s "
            "for %d: %s",
            placement.cost_s,
            new_tokens,
            f" (x{optimism:.2f}: our recent plans proved that much dearer)" if optimism > 1 else "",
            "?" if current_cost is None else f"{current_cost:.3f}",
            current_tokens,
            "switching" if switch else "keeping the current placement",
        )
        return switch

    def _awaits_first_plan(
        self,
        now: float,
        members: list[str],
        data_addrs: dict[str, tuple[str, ...]],
        links: dict[tuple[str, str], Link],
        measured: dict[str, StageCompute | None],
        private: frozenset[str] = frozenset(),
    ) -> bool:
        """Should the first plan wait for more of what it should be made on
        (control/planning/readiness.py), each within its bound (first_wait.py)?"""
        run = self.view.run
        assert run is not None
        roles = roles_of(self.view, members)
        coords = self.view.links.estimate.coordinates_of(self.view.self_id, now)
        # the states' holders, whenever we hold no plan: a restarted swarm's first plan, or a
        # restarted planner's, whose trainers' recent states then cover every block (no wait).
        # Never skipped on the run being under way: the organiser's `planned` outlives a swarm
        # that restarted beneath it, and members' steps are their own word
        saved = saved_states(self.view, members)
        gaps = first_plan_gaps(
            members, roles, data_addrs, links, measured, run, private, coords, saved
        )
        trainers = [peer for peer in members if roles.get(peer) == "trainer"]
        holders = holder_gaps(trainers, saved, run)
        return self._first_wait.awaits(now, gaps, holders, run)

    async def _search(
        self, inputs: PlanInputs, matrices: bytes | None, current: Plan | None
    ) -> Searched | None:
        """Run the scheduler in the planning child (control/planning/search_process.py) on the
        live matrices (or on `matrices`, an assessment's); None (logged) if it fails. A search
        that found no placement that fits says why, once per reason."""
        try:
            searched = await search_process.search(inputs, matrices, current)
        except Exception:  # a scheduler bug must not take the control plane down
            log.exception("the scheduler failed on %d peers; retrying later", len(inputs.members))
            return None
        if searched.refused and searched.refused != self._refused:
            self._refused = searched.refused  # it stands until the swarm changes
            log.warning("%s", searched.refused)
        return searched
