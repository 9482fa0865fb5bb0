"""The start of a new plan, chosen from its members' announcements by one pure rule, so that
every member computes the same answer from the same announcements (the announcing and the
wait for them: worker/resume/start_step.py).

The rule (docs/security.md, attack 4b), per stage (layers key) and step:
- only announcements of the plan's members count, each signed by the member it names;
- a state at a step is usable if two or more members announce it, or if no other member holds
  any of its blocks now (at its own newest announced step; of any lineage when the plan
  adopts: a lineage tag is the announcer's word), or if its one announcer is the only one of
  them placed at that stage (or, none being, the only one placed at all: the planner's
  placement is the authority a lone voice needs: a member cannot push a newer step of a stage
  it neither holds alone nor trains, and a replica cannot push one its stage-mates do not
  hold; the plan's donors, stopping peers kept to hand their stage over, are heard first on
  the blocks they hand over: worker/resume/covers.py); a spare's copies of a stage are
  announced only once their holder is gone (worker/resume/copy_sources.py);
- a stage nobody saved (the plan cuts the model anew) may be built from usable states of other
  layer ranges that hold all of its blocks at one step (worker/resume/covers.py, the same rule);
- the start step is the newest step at which every stage has a usable state (stage-mates that
  share no step: worker/resume/recency.py);
- the digest to fetch is the one the most members announce for that step; a tie goes to the
  digest of the best-placed announcer (placed at that stage first, then the plan's order), never
  to the lowest digest or peer id, which an attacker could grind.
A fetched state is loaded only if its sha256, computed on the received bytes, is that digest.

Lineage (records/lineage.py): each announced state carries the tag of the plan lineage it was
saved under; a member announces only its states the plan may use (its own lineage or an
ancestor's), and every reader drops the others too. So after a partition heals, the states the
other half trained are never chosen, never fetched, and never resumed from locally. The one
exception is a restarted swarm's first lineage, which has no state of its own: it adopts the
run's newest state of one earlier lineage (worker/resume/adopt.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from p2ptrain.records import Plan
from p2ptrain.train.checkpoint_folder import layers_key
from p2ptrain.worker.resume import adopt, covers, recency
from p2ptrain.worker.resume.announcement import Announced
from p2ptrain.worker.resume.covers import Cover
from p2ptrain.worker.resume.own_states import Held, StateRank, usable


@dataclass(frozen=True)
class StartPoint:
    """Where a new plan starts, the digest agreed for each stage at that step, and who said they
    hold what (to fetch a missing stage from)."""

    step: int
    note: str  # "" when every stage resumes exactly; otherwise what had to give
    held: dict[str, Held] = field(default_factory=dict, compare=False)
    digests: dict[str, str] = field(default_factory=dict)  # layers key -> agreed sha256
    # a stage nobody saved at `step` (the plan cuts the model anew) -> the states of other
    # layer ranges it is built from (worker/resume/covers.py); their digests are in `digests`
    sources: dict[str, Cover] = field(default_factory=dict)
    # the id of the earlier lineage whose states the plan adopts (worker/resume/adopt.py); "" if none
    adopted: str = ""
    # stages with no usable state at `step` when the stages share no step -> the step of the
    # state each resumes from instead (its digest is in `digests`): the newest usable before
    # `step`, else the oldest after it (its holders ran ahead and pruned older ones)
    steps: dict[str, int] = field(default_factory=dict)
    # a stage built from states that hold only some of its blocks -> the blocks none holds,
    # which start from initial weights (covers.best_partial)
    fresh: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def state_step(self, key: str) -> int:
        """The step of the state layers `key` resume from."""
        return self.steps.get(key, self.step)

    def holders(self, key: str, step: int) -> list[str]:
        """The members that announced the agreed state of layers `key` at `step` (any state of
        it if none was agreed), sorted."""
        agreed = self.digests.get(key) if step == self.state_step(key) else None
        return sorted(
            peer
            for peer, held in self.held.items()
            if step in held.get(key, {}) and agreed in (None, held[key][step])
        )


def placement(plan: Plan, n_layer: int) -> tuple[list[str], dict[str, set[str]]]:
    """The plan's members in its order (pipelines, then spares), and who it places at each
    stage: layers key -> peers (what choose_start_step weighs announcements by)."""
    members = [p for pipeline in plan.pipelines for p in pipeline] + list(plan.spares)
    ranges = plan.layer_ranges(n_layer)
    placed = {layers_key(r): {p[i] for p in plan.pipelines} for i, r in enumerate(ranges)}
    return members, placed


def choose_start_step(
    needed: list[str],
    held: Mapping[str, Held],
    placed: Mapping[str, Collection[str]] | None = None,
    order: Sequence[str] = (),
    holding: Mapping[str, Held] | None = None,
    donors: Mapping[str, range] | None = None,
) -> StartPoint:
    """The newest step at which every needed stage (layers key) has a usable state (the rule in
    the module's docstring), and the digest agreed for each stage there. `placed`: layers key ->
    the members the plan puts at that stage; `order`: the plan's members in its order;
    `holding`: what each member holds in any lineage (an adopting plan's candidates: whose
    blocks count against a lone announcer; `held` if None). Pure: every member computes the
    same answer from the same announcements.

    A stage nobody saved (the plan cuts the model anew) is available at a step where states of
    other layer ranges hold all of its blocks (worker/resume/covers.py); its own state, where usable,
    comes first. If no step is common (a stage has no state at all, e.g. its only holder left, or
    the states are further apart than the history), the newest step common to the stages that
    do have states is used, and the rest start fresh there: said in `note`, never silent. If
    no step is common to those either, the start is the earliest of their newest steps, and
    a stage without a usable state there resumes from its newest usable one before it, else
    its oldest after it (`steps`), agreed by digest like the others, so that a member placed
    at the stage fetches it from whichever member holds it (a spare's too).
    """
    placed = placed or {}
    fresh: dict[str, tuple[int, ...]] = {}
    own, built = covers.available(needed, held, placed, holding, None, donors)
    available = {key: own[key] | set(built[key]) for key in needed}
    # a stage no states cover: built from those that hold some of its blocks (covers.py:
    # best_partial), at the step the covered stages start from, or at its best if none is
    agreed = set.intersection(*[s for s in available.values() if s] or [set()])
    partial_at = {max(agreed)} if agreed else None
    lacking = not all(available.values())
    if lacking and (partial_at is not None or not any(available.values())):
        own, built = covers.available(needed, held, placed, holding, fresh, donors, partial_at)
        available = {key: own[key] | set(built[key]) for key in needed}
    if not any(available.values()):
        return StartPoint(0, "")  # a fresh run
    with_state = [steps for steps in available.values() if steps]
    common = set.intersection(*with_state)
    missing = sorted(key for key, steps in available.items() if not steps)
    if common:
        step = max(common)
        notes = [f"no saved state for {', '.join(missing)}: started fresh"] if missing else []
        notes += [
            f"no saved state for block{'s' * (len(b) > 1)} {', '.join(map(str, b))} of {key}: "
            "started fresh, its other blocks resumed"
            for key, b in sorted(fresh.items())
            if step in built[key]
        ]
        note = "; ".join(notes)
    else:
        step = min(max(steps) for steps in with_state)
        note = (
            f"stage states share no step: each resumes from its newest <= {step} "
            "(or its oldest after it)"
        )
    rank = {peer: index for index, peer in enumerate(order)}
    digests, sources, steps = {}, {}, {}
    for key in needed:
        if step in own[key]:
            digests[key] = _agreed_digest(key, step, held, placed.get(key, ()), rank)
        elif step in built[key]:
            sources[key] = built[key][step]
            for source in sources[key]:
                digests[source] = _agreed_digest(source, step, held, (), rank)
        elif own[key]:  # the stages share no step: agreed too, so that any member may fetch it
            earlier = [s for s in own[key] if s < step]
            steps[key] = max(earlier) if earlier else min(own[key])
            digests[key] = _agreed_digest(key, steps[key], held, placed.get(key, ()), rank)
    fresh = {key: blocks for key, blocks in fresh.items() if key in sources}
    return StartPoint(step, note, digests=digests, sources=sources, steps=steps, fresh=fresh)


def _agreed_digest(
    key: str, step: int, held: Mapping[str, Held], placed: Collection[str], rank: dict[str, int]
) -> str:
    holders = [peer for peer, states in held.items() if step in states.get(key, {})]
    votes = Counter(held[peer][key][step] for peer in holders)
    top = max(votes.values())
    tied = {digest for digest, count in votes.items() if count == top}
    best = min(
        (peer for peer in holders if held[peer][key][step] in tied),
        key=lambda peer: (peer not in placed, rank.get(peer, len(rank)), peer),
    )
    return held[best][key][step]


def choose_start(
    placed: Mapping[str, Collection[str]],
    announced: Mapping[str, Announced],
    rank: StateRank,
    order: Sequence[str],
    adopting: bool,
    donors: Mapping[str, range] | None = None,
) -> StartPoint:
    """The start of a plan from its members' announcements: `choose_start_step` on the states
    the plan may use; if `adopting` and no member holds a state of the plan's own lineage, on
    the candidate (the plan's states, or one earlier lineage's: worker/resume/adopt.py) with the
    newest start where every stage has a state (ties: the plan's own, more holders, the id).

    Every candidate is judged against what the members hold in every lineage, so a lone
    member's state (a tag is its word) counts only where nobody else holds those blocks (or the
    plan places it there); and among candidates that lack a stage, the one backed by more
    members comes first, so a lone member cannot outbid the others' lineage by filling a gap
    in its own at a higher step (docs/security.md, attack 29.11)."""
    needed = list(placed)
    strict = {peer: usable(states, rank) for peer, states in announced.items()}
    if not adopting or adopt.has_own_state(announced, rank):
        start = choose_start_step(needed, strict, placed, order, donors=donors)
        if lost := recency.lacking(needed, {*start.digests, *start.sources}, strict):
            # stage-mates that share no step (a volunteer back after a while): the latest
            # plan's states decide, loudly (worker/resume/recency.py)
            latest = recency.latest_history(announced, rank, recency.span(needed))
            retry = choose_start_step(needed, latest, placed, order, donors=donors)
            left = recency.lacking(needed, {*retry.digests, *retry.sources}, strict)
            if len(left) < len(lost):
                taken = ", ".join(k for k in lost if k not in left)
                note = f"the holders of {taken} share no step: the latest plan's state is taken"
                start = replace(retry, note="; ".join(n for n in (note, retry.note) if n))
        return replace(start, held=strict)
    holding = adopt.every_lineage(announced)
    best, best_score = StartPoint(0, "", held=strict), None
    for index, (lineage, held) in enumerate(adopt.candidates(announced, rank)):
        chosen = choose_start_step(needed, held, placed, order, holding, donors)
        start = replace(chosen, held=held)
        # nothing usable (all of it contested): no candidate, or its empty note would outrank
        # a lineage that lacks a stage and the swarm would start from initial weights
        if not start.digests:
            continue
        holders = sum(1 for states in held.values() if states)
        complete = all(
            (key in start.digests or key in start.sources) and key not in start.fresh
            for key in needed
        )
        backers = 0 if complete else len(_backers(start))
        score = (not start.note, complete, backers, start.step, holders, -index)
        if best_score is None or score > best_score:
            best, best_score = replace(start, adopted=lineage), score
    return best


def _backers(start: StartPoint) -> set[str]:
    """The members that announced a state the start agreed on."""
    return {peer for key in start.digests for peer in start.holders(key, start.state_step(key))}
