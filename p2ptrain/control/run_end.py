"""When a run is finished: every placed replica trained its last step, so nothing is left to plan
or wait for.

A run spec's `steps` bound the run. A peer placed in the current plan that reports step
`steps - 1` done (its gossiped metrics), or our own worker doing so, is *done*: it trained the
run to its end and its node leaves, and that departure is not a loss (the planner does not
re-plan it: control/planning/plan_maker.py). The run is finished for this node once every peer
the current plan places is done or gone (no longer live, or its worker unhealthy: a placed peer
that died mid-run, or that we never heard report its last step, must not hold the end up for
ever) and at least one of them, or our own worker, is done; or once the organiser says so (the
bootstrap's sync replies: control/sync.py).
Under sync = "step" all pipelines reach the last step together; under "diloco" each replica
runs at its own pace, and the run waits for the slowest (bench scaleout run 6: the first
replica's last step ended the run for all, and the lagging ones lost their last steps).

The facts are latched per run spec: a run spec with more `steps` (a run continued after a
restart, issue 30) is another run, not finished until its own last step. A finished run gets no
new plan or claim (control/election.py); spares and late joiners leave (control/run_watch.py).
Pure.

Whose word counts: a peer placed in the plan we follow (it trains the run: what it says of its
own step is evidence we weigh like its links), our own worker, and the organiser. A spare or a
stranger's metrics end nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from p2ptrain.records import PeerMetrics, Plan, RunSpec

if TYPE_CHECKING:
    from p2ptrain.control.membership import Member


def last_step_reached(run: RunSpec, metrics: PeerMetrics | None) -> bool:
    """Do these metrics report the run's last step (steps - 1) done?"""
    return metrics is not None and metrics.step is not None and metrics.step >= run.optim.steps - 1


def placed(plan: Plan | None, peer: str) -> bool:
    """Does `plan` give `peer` a stage (not a spare)?"""
    return plan is not None and any(peer in pipeline for pipeline in plan.pipelines)


def placed_peers(plan: Plan | None) -> set[str]:
    """The peers `plan` gives a stage."""
    return set() if plan is None else {peer for pipeline in plan.pipelines for peer in pipeline}


@dataclass
class RunEnd:
    """Which placed peers trained the run's last step, and whether the run is finished for this
    node (None: no run is), and how it learnt it."""

    finished_run: RunSpec | None = None
    how: str = ""  # "step 20 of 20 trained by every placed peer (...)" or "the organiser says so"
    done_run: RunSpec | None = None  # the run `done` is about
    done: set[str] = field(default_factory=set)  # peers that trained its last step while placed
    own_done: bool = False  # ... and whether our own worker did

    def is_finished(self, run: RunSpec | None) -> bool:
        return run is not None and self.finished_run == run

    def done_of(self, run: RunSpec | None) -> set[str]:
        """The peers that trained `run`'s last step (placed when they said so)."""
        return set(self.done) if run is not None and self.done_run == run else set()

    def done_in(self, run: RunSpec | None, plan: Plan | None) -> set[str]:
        """The peers `plan` places that trained `run`'s last step."""
        return self.done_of(run) & placed_peers(plan)

    def note_metrics(
        self,
        run: RunSpec | None,
        peer: str,
        metrics: PeerMetrics | None,
        plan: Plan | None,
        own: bool = False,
    ) -> bool:
        """A peer's (or, `own`, our worker's) latest metrics: True if they newly say it trained
        the run's last step (our worker's: gossip it at once)."""
        if run is None or not last_step_reached(run, metrics):
            return False
        if not own and not placed(plan, peer):
            return False  # only a peer that trains the run may say it is done
        if self.done_run != run:
            self.done_run, self.done, self.own_done = run, set(), False
        if peer in self.done:
            return False
        self.done.add(peer)
        self.own_done = self.own_done or own
        return True

    def settle(
        self,
        run: RunSpec | None,
        plan: Plan | None,
        metrics_of: Callable[[str], PeerMetrics | None],
        gone: Callable[[str], bool],
    ) -> bool:
        """Is the run finished now, by the placed peers' word? True if it is, newly. The placed
        peers' metrics are read again (`metrics_of`): one may have come in before the plan that
        places its author. `gone(peer)`: the peer no longer trains (left, died, unhealthy)."""
        if run is None or self.is_finished(run):
            return False
        required = placed_peers(plan)
        for peer in required:
            self.note_metrics(run, peer, metrics_of(peer), plan)
        done = self.done_in(run, plan)
        if not done and not (self.own_done and self.done_run == run):
            return False  # no one trained the last step yet
        if any(peer not in done and not gone(peer) for peer in required):
            return False  # a placed replica still trains
        lost = len(required - done)
        self.finished_run = run
        self.how = f"step {run.optim.steps} of {run.optim.steps} trained by every placed peer" + (
            f" ({len(done)} reported it, {lost} gone before)" if lost else ""
        )
        return True

    def note_organiser(self, run: RunSpec | None, finished: object) -> bool:
        """The organiser's word (a sync reply's `finished`): True if it finishes the run now."""
        if run is None or finished is not True or self.is_finished(run):
            return False
        self.finished_run, self.how = run, "the organiser says so"
        return True


def lost_before_end(plan: Plan, live: Collection[str], done: Collection[str]) -> list[str]:
    """The peers `plan` places that are neither live (`live`: the members a plan may place) nor
    done: lost before their last step. A done peer that left is not lost."""
    return sorted(p for p in placed_peers(plan) if p not in done and p not in live)


def steps_left(members: Mapping[str, Member], run: RunSpec, plan: Plan) -> int | None:
    """Steps of the run after the one the peers `plan` places reported, their low median
    (`members`: the view's Members, each with its latest metrics); None: none reported yet.
    The planner switches no placement near the run's end (control/planning/plan_maker.py), so
    one peer's word must not say the end is near: a spare's, a step past the run's last, or one
    reported at another place (a stale report of an earlier plan) does not count, and a placed
    liar moves the low median only with a majority behind it."""
    last = run.optim.steps - 1
    places = {
        peer: (stage, replica)
        for replica, pipeline in enumerate(plan.pipelines)
        for stage, peer in enumerate(pipeline)
    }
    reported = sorted(
        metrics.step
        for peer, place in places.items()
        if peer in members
        and (metrics := members[peer].metrics) is not None
        and metrics.step is not None
        and metrics.step <= last
        and (metrics.stage is None or (metrics.stage, metrics.replica) == place)
    )
    return last - reported[(len(reported) - 1) // 2] if reported else None
