"""When a run is finished: its last step is trained, so nothing is left to plan or wait for.

A run spec's `steps` bound the run: once a worker placed in the current plan reports step
`steps - 1` done (its gossiped metrics), or our own worker does, or the organiser says so (the
bootstrap's sync replies: control/sync.py), the run is finished for this node. The fact is
latched per run spec: a run spec with more `steps` (a run continued after a restart, issue 30)
is another run, not finished until its own last step. A finished run gets no new plan or claim
(control/election.py); spares and late joiners leave (control/run_watch.py). Pure.

Whose word counts: a peer placed in the plan we follow (it trains the run: what it says of its
own step is evidence we weigh like its links), our own worker, and the organiser. A spare or a
stranger's metrics end nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.records import PeerMetrics, Plan, RunSpec


def last_step_reached(run: RunSpec, metrics: PeerMetrics | None) -> bool:
    """Do these metrics report the run's last step (steps - 1) done?"""
    return metrics is not None and metrics.step is not None and metrics.step >= run.optim.steps - 1


def placed(plan: Plan | None, peer: str) -> bool:
    """Does `plan` give `peer` a stage (not a spare)?"""
    return plan is not None and any(peer in pipeline for pipeline in plan.pipelines)


@dataclass
class RunEnd:
    """The run spec this node knows to be finished (None: none), and how it learnt it."""

    finished_run: RunSpec | None = None
    how: str = ""  # "step 20 of 20 trained, reported by 12D3…" or "the organiser says so"

    def is_finished(self, run: RunSpec | None) -> bool:
        return run is not None and self.finished_run == run

    def note_metrics(
        self,
        run: RunSpec | None,
        peer: str,
        metrics: PeerMetrics | None,
        plan: Plan | None,
        own: bool = False,
    ) -> bool:
        """A peer's (or, `own`, our worker's) latest metrics: True if they finish the run now."""
        if run is None or self.is_finished(run) or not last_step_reached(run, metrics):
            return False
        if not own and not placed(plan, peer):
            return False  # only a peer that trains the run may say it is done
        assert metrics is not None and metrics.step is not None
        self.finished_run = run
        who = "our worker" if own else peer
        self.how = f"step {metrics.step + 1} of {run.optim.steps} trained, reported by {who}"
        return True

    def note_organiser(self, run: RunSpec | None, finished: object) -> bool:
        """The organiser's word (a sync reply's `finished`): True if it finishes the run now."""
        if run is None or finished is not True or self.is_finished(run):
            return False
        self.finished_run, self.how = run, "the organiser says so"
        return True
