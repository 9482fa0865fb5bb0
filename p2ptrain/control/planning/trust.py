"""What the planner believes of its members' compute, in plain Python (the control process's
side: compute.py builds the scheduler's vector from it in the planning child).

A peer's word on its speed is evidence, not authority (issue 26.9): a peer whose pipeline steps
run REPRICE_AFTER times slower than its plan predicted is priced that much slower
(ComputeTrust), and a new measurement is worth a re-plan (measured_peers).
"""

from __future__ import annotations

from collections.abc import Mapping

from p2ptrain.records import PeerMetrics, Plan, RunSpec, StageCompute

# a pipeline whose steps run this many times slower than its plan predicted re-prices its peers
REPRICE_AFTER = 1.5
MAX_REPRICE = 1e3  # the most a peer's claimed times are multiplied by
# a plan is judged this long after it was first seen: the steps reported before are older plans'
JUDGE_AFTER_S = 60.0
# a member whose step reports contradicted this many different pipeline-mates' is the liar,
# within the last CONTRADICTION_PLANS plans judged (an honest member two liars contradicted
# long apart is not re-priced, and what is remembered stays bounded)
CONTRADICTING_MATES = 2
CONTRADICTION_PLANS = 8


def compute_known(
    peers: list[str], measured: Mapping[str, StageCompute | None], run: RunSpec
) -> bool:
    """Will the plan be priced on compute: is the run compute-aware, and has one of `peers`
    timed this run's model (compute.peer_compute's vector is None otherwise)?"""
    return run.swarm.compute_aware and any(
        (compute := measured.get(peer)) is not None and compute.run_id == run.run_id
        for peer in peers
    )


def measured_peers(peers: list[str], measured: Mapping[str, StageCompute | None]) -> frozenset[str]:
    """Which of `peers` have a measurement: a new one is worth a re-plan."""
    return frozenset(p for p in peers if measured.get(p) is not None)


class ComputeTrust:
    """Per-peer factors on claimed compute, learnt from the step times the plan's trainers
    report (telemetry), once per plan. A pipeline's members step together, so honest ones
    report one pace: where they agree, or where most of them do (the low median of their
    reports), and that pace is REPRICE_AFTER times the plan's predicted step or more, each of
    its peers' times are multiplied by the ratio. The next plan's prediction then holds the
    factor, so it does not compound while that plan runs as predicted.

    A report that contradicts its mates' by REPRICE_AFTER is one member's word against
    another's: the slowest report used to count, and one member reporting 1e9 s steps priced
    its honest mates 1,000 times slower, every plan it shared with them; the fastest would let
    a slow member hide its pipeline's pace. So a contradiction re-prices no one at once; it is
    noted on both sides, and a member that contradicted CONTRADICTING_MATES different mates
    within CONTRADICTION_PLANS judged plans (a liar contradicts every honest one; an honest
    member only a liar) is re-priced by its pipeline's slowest report over the prediction,
    alone. Left: a slow member that reports fast steps in a pipeline of two hides its pace
    until a second mate contradicts it; two liars taking turns beside one honest member within
    those plans re-price it."""

    def __init__(self) -> None:
        self.factors: dict[str, float] = {}
        # member -> mate whose step reports its own contradicted -> in which judgement
        self.contradicted: dict[str, dict[str, int]] = {}
        self._num_judged = 0
        self._judged: set[tuple[int, int]] = set()
        self._first_seen: tuple[tuple[int, int], float] | None = None

    def observe(
        self, plan: Plan | None, metrics: Mapping[str, PeerMetrics | None], now: float
    ) -> bool:
        """Judge `plan` on the latest step each of its trainers reported (as placed by it),
        JUDGE_AFTER_S after it was first seen; True if some peer was re-priced (once a plan)."""
        if plan is None or not plan.predicted_step_s or plan.key in self._judged:
            return False
        if self._first_seen is None or self._first_seen[0] != plan.key:
            self._first_seen = (plan.key, now)
        if now - self._first_seen[1] < JUDGE_AFTER_S:
            return False
        reports: list[dict[str, float]] = []
        for replica, pipeline in enumerate(plan.pipelines):
            steps = {
                peer: m.step_s
                for stage, peer in enumerate(pipeline)
                if (m := metrics.get(peer)) is not None
                and m.step_s is not None
                and (m.stage, m.replica) == (stage, replica)
            }
            if len(steps) < len(pipeline):
                return False  # judged once every trainer of the plan has stepped under it
            reports.append(steps)
        self._judged.add(plan.key)
        self._num_judged += 1
        self._forget_old_contradictions()
        slow: dict[str, float] = {}
        for steps in reports:
            slow.update(self._judge_pipeline(steps, plan.predicted_step_s))
        for peer, ratio in slow.items():
            self.factors[peer] = min(MAX_REPRICE, self.factors.get(peer, 1.0) * ratio)
        return bool(slow)

    def _judge_pipeline(self, steps: dict[str, float], predicted_s: float) -> dict[str, float]:
        """The ratios one pipeline's reports re-price its members by (see the class)."""
        ordered = sorted(steps.values())
        pace = ordered[(len(ordered) - 1) // 2]  # the low median: most members' word
        slow = {}
        if pace / predicted_s >= REPRICE_AFTER:
            slow = dict.fromkeys(steps, pace / predicted_s)
        for peer, step_s in steps.items():
            for mate, mate_s in steps.items():
                if mate != peer and max(step_s, mate_s) >= REPRICE_AFTER * min(step_s, mate_s):
                    self.contradicted.setdefault(peer, {})[mate] = self._num_judged
        worst = ordered[-1] / predicted_s
        for peer in steps:
            if (
                len(self.contradicted.get(peer, ())) >= CONTRADICTING_MATES
                and worst >= REPRICE_AFTER
            ):
                slow[peer] = max(slow.get(peer, 1.0), worst)
        return slow

    def _forget_old_contradictions(self) -> None:
        oldest = self._num_judged - CONTRADICTION_PLANS
        for peer in list(self.contradicted):
            mates = {m: at for m, at in self.contradicted[peer].items() if at > oldest}
            if mates:
                self.contradicted[peer] = mates
            else:
                del self.contradicted[peer]
