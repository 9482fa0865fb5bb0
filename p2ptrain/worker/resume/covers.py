"""A new plan's stage assembled from saved states of other layer ranges: the choice (pure).

A plan that cuts the model differently from the last one (another stage count, or other
`stage_layers`) needs stages nobody has saved: L0-3 where the members hold L0-2 and L2-4. A
stage is then *covered* at a step when announced states of other ranges, all at that step,
hold every one of its blocks (and the embedding or head it needs: a range that holds block 0
holds the embedding, one that holds the last block holds the head). The worker then builds the
stage's weights and AdamW moments from those states (train/recut.py): nothing is lost by
re-cutting the model.

Which announcements count (docs/security.md, attack 4b), for a stage's own state and for
other ranges alike, per stage J of the plan: a state of range K at step s may give the blocks K
shares with J if two or more members announce it, or if no other member holds any of those
blocks now (at its own newest announced step), or if its one announcer is the only one of
them placed at J, or (none of them placed at J) the only one the plan places at all; a donor
of the plan (a stopping peer the planner kept to hand its stage over) is heard first, before
those placed at J, on the blocks of the stage it hands over (Plan.donor_blocks, the planner's
word) and on no others, unless one placed at J holds a newer step of them (a donor kept into a
later plan, after its taker trained on: it would roll every stage back); its state is the
newest of those blocks by the plan's own making, and the peer placed there to take them over
may hold an older one. A member's
older states do not count against another's: the blocks it trained before a re-cut are someone
else's now. A plan that adopts (worker/resume/adopt.py) weighs each candidate lineage against
what the members hold in every lineage (`holding`): a lineage tag is the announcer's word, so
a lone member's made-up lineage counts only for blocks nobody else holds at all (attack 29.11).
So a member cannot push a newer step of
blocks that someone the plan places there holds, whether it names them as a stage or in pieces;
the planner's placement is the authority a lone voice needs (with one replica, the member placed
at a stage may always resume it from its own states).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

Held = Mapping[str, Mapping[int, str]]  # one member's: layers key -> step -> sha256
Cover = tuple[str, ...]  # the layers keys whose states build one stage, in block order

_KEY = re.compile(r"^L([0-9]{1,6})-([0-9]{1,6})$")


def key_range(key: str) -> range | None:
    """'L0-2' -> range(0, 2); None for anything else, 'L00-2' included (keys come off the
    wire, and one range must have one name)."""
    match = _KEY.fullmatch(key)
    if not match or int(match[1]) >= int(match[2]):
        return None
    blocks = range(int(match[1]), int(match[2]))
    return blocks if key == f"L{blocks.start}-{blocks.stop}" else None


def _overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _newest_ranges(held: Mapping[str, Held], n_layer: int) -> dict[str, list[range]]:
    """Each member's ranges at its own newest announced step: the blocks it holds now."""
    found: dict[str, list[range]] = {}
    for peer, states in held.items():
        newest = max((step for steps in states.values() for step in steps), default=None)
        found[peer] = [
            r
            for key, steps in states.items()
            if newest in steps and (r := key_range(key)) is not None and r.stop <= n_layer
        ]
    return found


def usable_steps(
    key: str,
    stage: str,
    held: Mapping[str, Held],
    placed: Collection[str],
    planned: Collection[str],
    newest: Mapping[str, list[range]],
    donors: Mapping[str, range] | None = None,
) -> set[int]:
    """The steps at which range `key`'s state may give the blocks it shares with the plan's
    stage `stage` (the module's rule). `placed`: the members placed at that stage; `planned`:
    those placed at any; `newest`: _newest_ranges; `donors`: the plan's, with their blocks."""
    blocks, target = key_range(key), key_range(stage)
    if blocks is None or target is None or not _overlap(blocks, target):
        return set()
    part = range(max(blocks.start, target.start), min(blocks.stop, target.stop))
    announced: dict[int, list[str]] = {}
    for peer, states in held.items():
        for step in states.get(key, {}):
            announced.setdefault(step, []).append(peer)

    def trusted(peer: str) -> bool:
        voices = {peer} | {
            q for q, ranges in newest.items() if any(_overlap(r, part) for r in ranges)
        }
        if voices == {peer}:
            return True
        at_stage = max((_newest_step(held, q) for q in voices & set(placed)), default=-1)
        first = {
            d
            for d, r in (donors or {}).items()
            if r.start <= part.start < part.stop <= r.stop and _newest_step(held, d) >= at_stage
        }
        heard = voices & first or voices & set(placed) or voices & set(planned)
        return heard == {peer}

    return {step for step, peers in announced.items() if len(peers) >= 2 or trusted(peers[0])}


def _newest_step(held: Mapping[str, Held], peer: str) -> int:
    """The newest step `peer` announced (-1: none)."""
    return max((s for steps in held.get(peer, {}).values() for s in steps), default=-1)


def cover(blocks: range, keys: Collection[str]) -> Cover | None:
    """The fewest of `keys` whose ranges hold every block of `blocks`, in block order: from the
    first block on, each time the range that reaches furthest (ties: the one starting later).
    None if some block is in none of them."""
    chosen, uncovered = partial_cover(blocks, keys)
    return None if uncovered else chosen


def partial_cover(blocks: range, keys: Collection[str]) -> tuple[Cover, tuple[int, ...]]:
    """`cover`'s ranges for the blocks `keys` hold, and the blocks none of them holds."""
    ranges = [(r, key) for key in keys if (r := key_range(key)) is not None]
    chosen: list[str] = []
    uncovered: list[int] = []
    position = blocks.start
    while position < blocks.stop:
        holding = [(r.stop, r.start, key) for r, key in ranges if position in r]
        if not holding:
            uncovered.append(position)
            position += 1
            continue
        stop, _, key = max(holding)  # one name per range: (stop, start) decides
        chosen.append(key)
        position = stop
    return tuple(chosen), tuple(uncovered)


def best_partial(
    blocks: range, sources: Mapping[str, set[int]]
) -> tuple[int, Cover, tuple[int, ...]] | None:
    """For a stage nothing covers at any step: the step whose usable states (`sources`: layers
    key -> steps) hold the most of its blocks (ties: the newest), their cover and the blocks
    left without a state (they start from initial weights); None if no state holds any."""
    best = None
    for step in {s for steps in sources.values() for s in steps}:
        chosen, uncovered = partial_cover(blocks, [k for k, s in sources.items() if step in s])
        if chosen and (best is None or (-len(uncovered), step) > (-len(best[2]), best[0])):
            best = (step, chosen, uncovered)
    return best


def available(
    needed: Collection[str],
    held: Mapping[str, Held],
    placed: Mapping[str, Collection[str]],
    holding: Mapping[str, Held] | None = None,
    fresh: dict[str, tuple[int, ...]] | None = None,
    donors: Mapping[str, range] | None = None,
    partial_at: Collection[int] | None = None,
) -> tuple[dict[str, set[int]], dict[str, dict[int, Cover]]]:
    """For each stage of the plan (layers key): the steps of its own usable states, and step ->
    the usable states of other ranges that build it there (where it has none of its own).
    Ranges past the model's last block (the stages end at it) are ignored. `holding`: what each
    member holds in any lineage, whose blocks count against a lone announcer (`held` if None).
    With `fresh`, a stage no states cover at any step is built at the step (among `partial_at`,
    if given) whose states hold the most of its blocks (`best_partial`): `fresh` gets the blocks
    it lacks, which start from initial weights (a peer killed with the only state of its stage:
    its survivors keep theirs, where starting the whole run over would lose every stage's
    training)."""
    n_layer = max((r.stop for k in needed if (r := key_range(k)) is not None), default=0)
    newest = _newest_ranges(held if holding is None else holding, n_layer)
    planned = {peer for members in placed.values() for peer in members}
    keys = sorted(
        k
        for k in {k for states in held.values() for k in states} - set(needed)
        if (r := key_range(k)) is not None and r.stop <= n_layer
    )
    own: dict[str, set[int]] = {}
    built: dict[str, dict[int, Cover]] = {}
    for stage in needed:
        members = placed.get(stage, ())
        own[stage] = usable_steps(stage, stage, held, members, planned, newest, donors)
        sources = {k: usable_steps(k, stage, held, members, planned, newest, donors) for k in keys}
        sources = {k: steps for k, steps in sources.items() if steps}
        built[stage] = {}
        blocks = key_range(stage)
        for step in sorted({s for steps in sources.values() for s in steps} - own[stage]):
            found = (
                None
                if blocks is None
                else cover(blocks, [k for k, steps in sources.items() if step in steps])
            )
            if found is not None:
                built[stage][step] = found
        if partial_at is not None:
            sources = {k: steps & set(partial_at) for k, steps in sources.items()}
        partial = (
            None
            if own[stage] or built[stage] or blocks is None or fresh is None
            else best_partial(blocks, sources)
        )
        if partial is not None and fresh is not None:
            step, built[stage][step], fresh[stage] = partial
    return own, built
