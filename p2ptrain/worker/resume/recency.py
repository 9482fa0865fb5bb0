"""When a stage's holders contest each other and share no step: the latest plan's states decide.

The start rule (worker/resume/start_choice.py) lets a lone announcer's state count only where no
other member holds those blocks, or where the plan places it alone. So when two replicas of a
stage hold states that share no step, neither counts. That is how an honest swarm looks when a
volunteer comes back: it stopped at step 21, its stage-mate trained on alone to step 54 and
kept only steps 40-54. The stage had no usable state, the plan started at step 0, each replica
loaded its own, different state, and ~50 steps of schedule were lost, without a word.

Then, and only then (`lacking`: a stage without an agreed state although members hold states
of its blocks), the choice is made again on each member's states less those of blocks another
member holds under a later plan (`latest_history`): a plan is later if its lineage is closer to
the starting plan's (Plan.state_rank), or, in one lineage, its epoch is higher. The returning
volunteer's states were saved under earlier plans than its stage-mate's, so the stage-mate's
newest state is agreed, and the volunteer fetches it. The lineage tag is its announcer's word
(docs/security.md, "Stage states (4b)"): a member lying about it can win only here, where the
stage would otherwise restart from step 0, and a tie (two members claiming one plan) changes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from p2ptrain.records.lineage import parse_tag
from p2ptrain.worker.resume.announcement import Announced
from p2ptrain.worker.resume.covers import key_range

Held = dict[str, dict[int, str]]  # layers key -> step -> sha256 (own_states.Held)


def written_under(tag: str | None, position: int) -> tuple[int, int]:
    """How late a state's plan is, as an order (larger: later): its lineage's closeness to the
    starting plan (`position`: Plan.state_rank of its tag), then its epoch (untagged: -1)."""
    parsed = None if tag is None else parse_tag(tag)
    return (-position, -1 if parsed is None else parsed[1])


def lacking(
    needed: Collection[str], agreed: Collection[str], held: Mapping[str, Held]
) -> list[str]:
    """The needed stages without an agreed state (`agreed`: keys with a digest or a build)
    although some member holds a state of their blocks."""
    held_ranges = [r for states in held.values() for k in states if (r := key_range(k))]
    return [
        key
        for key in needed
        if key not in agreed
        and (target := key_range(key)) is not None
        and any(r.start < target.stop and target.start < r.stop for r in held_ranges)
    ]


def span(keys: Collection[str]) -> range:
    """The blocks the keys cover together, first to last (the plan's stages: the model's)."""
    ranges = [r for key in keys if (r := key_range(key)) is not None]
    return range(
        min((r.start for r in ranges), default=0), max((r.stop for r in ranges), default=0)
    )


def latest_history(
    announced: Mapping[str, Announced],
    rank: Callable[[str | None], int | None],
    within: range | None = None,
) -> dict[str, Held]:
    """Each member's states the plan may use (`rank`: Plan.state_rank), less those of blocks
    that another member holds a state of under a later plan. Linear in the states announced:
    each block's two latest holders are found once (comparing every state with every other
    member's cost two members announcing 256 keys × 64 steps each ~17 s of a worker's CPU),
    and a key's blocks are taken `within` the plan's (an announced "L0-999999" is a key's
    format: a million blocks a step, ~80 s a key)."""
    states = [
        (peer, key, blocks, step, digest, written_under(tag, position))
        for peer, announcement in announced.items()
        for key, steps in announcement.items()
        if (blocks := _clipped(key_range(key), within))
        for step, (digest, tag) in steps.items()
        if (position := rank(tag)) is not None
    ]
    latest: dict[int, list[tuple[tuple[int, int], str]]] = {}  # block -> its 2 latest holders
    for peer, _, blocks, _, _, order in states:
        for block in blocks:
            _note_holder(latest.setdefault(block, []), order, peer)
    kept: dict[str, Held] = {}
    for peer, key, blocks, step, digest, order in states:
        overtaken = any(
            other > order for block in blocks for other, q in latest[block] if q != peer
        )
        if not overtaken:
            kept.setdefault(peer, {}).setdefault(key, {})[step] = digest
    return kept


def _note_holder(
    holders: list[tuple[tuple[int, int], str]], order: tuple[int, int], peer: str
) -> None:
    """Keep a block's two latest holders (distinct peers, latest first): whoever else holds a
    block latest is one of them, whichever member asks."""
    for index, (known, holder) in enumerate(holders):
        if holder == peer:
            if order > known:
                holders[index] = (order, peer)
                holders.sort(reverse=True)
            return
    holders.append((order, peer))
    holders.sort(reverse=True)
    del holders[2:]


def _clipped(blocks: range | None, within: range | None) -> range | None:
    """`blocks` within `within` (None: as they are); None if nothing is left."""
    if blocks is None or within is None:
        return blocks
    clipped = range(max(blocks.start, within.start), min(blocks.stop, within.stop))
    return clipped or None
