"""What the planner believes of its members' compute, in plain Python (the control process's
side: compute.py builds the scheduler's vector from it in the planning child).

A peer's word on its speed is evidence, not authority (issue 26.9): a peer whose pipeline steps
run REPRICE_AFTER times slower than its plan predicted is priced that much slower
(ComputeTrust), and a new measurement is worth a re-plan (measured_peers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
# a placed member with no step reported at its place this long after one of its pipeline-mates'
# reported step moved (past JUDGE_AFTER_S) is silent: a pipeline steps together, and telemetry
# goes out every 2-4 s
SILENT_AFTER_S = 30.0


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
    report (telemetry), once per pipeline of a plan. A pipeline's members step together, so
    honest ones report one pace: where they agree, or where most of them do (the low median of
    their reports), and that pace is REPRICE_AFTER times the plan's predicted step or more, each
    of its peers' times are multiplied by the ratio. The next plan's prediction then holds the
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
    those plans re-price it.

    A pipeline was judged only once every member reported a step at its place: a placed member
    that claimed fast compute and then reported no step (or another place) was never judged.
    A pipeline some of whose members stay silent is judged SILENT_AFTER_S after a reporting
    mate's step moved (it steps under this plan, silent members too): a silent member counts
    as the fastest report in the pace (its silence frames no mate) and as contradicting every
    reporting mate, noted on its side only, so it is re-priced like a liar that reports fast
    steps (a mate's moving report is that mate's word: a silent member re-priced at once would
    be framed by one liar beside it while its session still starts)."""

    def __init__(self) -> None:
        self.factors: dict[str, float] = {}
        # member -> mate whose step reports its own contradicted -> in which judgement
        self.contradicted: dict[str, dict[str, int]] = {}
        self._num_judged = 0
        self._watch: _Watch | None = None  # the latest plan's judgement

    def observe(
        self, plan: Plan | None, metrics: Mapping[str, PeerMetrics | None], now: float
    ) -> bool:
        """Judge `plan`'s pipelines on the latest step each of their trainers reported (as
        placed by it), JUDGE_AFTER_S after it was first seen; True if some peer was re-priced
        (once a pipeline)."""
        if plan is None or not plan.predicted_step_s:
            return False
        if self._watch is None or self._watch.key != plan.key:
            self._watch = _Watch(plan.key, now)
        watch = self._watch
        if now - watch.seen_at < JUDGE_AFTER_S:
            return False
        slow: dict[str, float] = {}
        for replica, pipeline in enumerate(plan.pipelines):
            if replica in watch.judged:
                continue
            reports = {
                peer: m
                for stage, peer in enumerate(pipeline)
                if (m := metrics.get(peer)) is not None
                and m.step_s is not None
                and (m.stage, m.replica) == (stage, replica)
            }
            silent = [peer for peer in pipeline if peer not in reports]
            if silent and not watch.silent_long(replica, reports, now):
                continue
            if not watch.judged:  # the plan's first judged pipeline
                self._num_judged += 1
                self._forget_old_contradictions()
            watch.judged.add(replica)
            steps = {peer: m.step_s for peer, m in reports.items() if m.step_s is not None}
            slow.update(self._judge_pipeline(steps, silent, plan.predicted_step_s))
        for peer, ratio in slow.items():
            self.factors[peer] = min(MAX_REPRICE, self.factors.get(peer, 1.0) * ratio)
        return bool(slow)

    def _judge_pipeline(
        self, steps: dict[str, float], silent: list[str], predicted_s: float
    ) -> dict[str, float]:
        """The ratios one pipeline's reports re-price its members by (see the class)."""
        ordered = sorted(steps.values())
        # the low median: most members' word; a silent member's counts as the fastest
        pace = ([0.0] * len(silent) + ordered)[(len(silent) + len(ordered) - 1) // 2]
        slow = {}
        if pace / predicted_s >= REPRICE_AFTER:
            slow = dict.fromkeys([*steps, *silent], pace / predicted_s)
        for peer, step_s in steps.items():
            for mate, mate_s in steps.items():
                if mate != peer and max(step_s, mate_s) >= REPRICE_AFTER * min(step_s, mate_s):
                    self.contradicted.setdefault(peer, {})[mate] = self._num_judged
        for peer in silent:
            for mate in steps:
                self.contradicted.setdefault(peer, {})[mate] = self._num_judged
        worst = ordered[-1] / predicted_s
        for peer in [*steps, *silent]:
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


@dataclass
class _Watch:
    """One plan's judgement so far: when it was first seen, its pipelines (by replica) judged,
    and for each pipeline judged without some members, its reporters' steps when first looked
    at and since when one of them moved."""

    key: tuple[int, int]
    seen_at: float
    judged: set[int] = field(default_factory=set)
    first_steps: dict[int, dict[str, int | None]] = field(default_factory=dict)
    moved_at: dict[int, float] = field(default_factory=dict)

    def silent_long(self, replica: int, reports: Mapping[str, PeerMetrics], now: float) -> bool:
        """Have the pipeline's silent members been silent SILENT_AFTER_S since a reporting
        mate's step moved? A report matching the place may be an older plan's: only one that
        moves proves the pipeline steps under this one."""
        if not reports:
            return False  # no evidence that it steps at all (a stalled one: control/health.py)
        steps = {peer: m.step for peer, m in reports.items()}
        first = self.first_steps.setdefault(replica, steps)
        if replica not in self.moved_at:
            if any(peer not in first or first[peer] != step for peer, step in steps.items()):
                self.moved_at[replica] = now
            return False
        return now - self.moved_at[replica] >= SILENT_AFTER_S
