"""The plan lineage rule (records/lineage.py): whose stage states a plan may use."""

from __future__ import annotations

import pytest

from p2ptrain.errors import WireError
from p2ptrain.records import Plan
from p2ptrain.records.lineage import MAX_LINEAGE, Lineage, next_lineage, parse_tag
from tests.records.samples import plan_dict


def plan(term: int, epoch: int, planner: str, lineage: Lineage) -> Plan:
    return Plan(
        term=term,
        epoch=epoch,
        planner=planner,
        stages=1,
        pipelines=(("A",),),
        spares=(),
        data_addrs={},
        cost_s=0.0,
        lineage=lineage,
    )


def successor(previous: Plan | None, term: int, epoch: int, planner: str) -> Plan:
    """The plan `planner` makes replacing `previous` (what control/planning/plan_maker.py does)."""
    continues = previous is not None and (previous.term, previous.planner) == (term, planner)
    lineage = next_lineage(
        () if previous is None else previous.lineage, continues, term, epoch, planner
    )
    return plan(term, epoch, planner, lineage)


def test_a_planner_continuing_its_term_keeps_the_lineage_id() -> None:
    first = successor(None, 1, 1, "P")
    second = successor(first, 1, 2, "P")
    assert second.lineage == ((first.lineage[0][0], 2),)
    assert first.state_tag is not None and second.state_rank(first.state_tag) == 0
    assert first.state_rank(second.state_tag) is None  # a later epoch is not an ancestor's


def test_a_new_term_starts_a_new_id_and_keeps_the_ancestor() -> None:
    ancestor = successor(successor(None, 1, 1, "P"), 1, 2, "P")
    elected = successor(ancestor, 2, 1, "Q")
    assert elected.lineage[0][0] != ancestor.lineage[0][0]
    assert elected.lineage[1:] == ancestor.lineage  # forked at the ancestor's epoch 2
    assert elected.state_rank(ancestor.state_tag) == 1
    assert elected.state_rank(None) == 2  # the root (untagged states): usable, ranked last
    # the same planner re-elected under a new term starts a new id too
    assert successor(ancestor, 2, 1, "P").lineage[0][0] != ancestor.lineage[0][0]


def test_the_two_halves_of_a_partition_refuse_each_others_states() -> None:
    ancestor = successor(successor(None, 1, 1, "P"), 1, 2, "P")
    # each half elected a planner (the same term): different ids, the same common ancestor
    left, right = successor(ancestor, 2, 1, "Q"), successor(ancestor, 2, 1, "R")
    assert left.lineage[0][0] != right.lineage[0][0]
    assert left.state_rank(right.state_tag) is None and right.state_rank(left.state_tag) is None
    assert left.state_rank(ancestor.state_tag) == right.state_rank(ancestor.state_tag) == 1
    # one half kept the old planner (its id), and re-planned past the fork at epoch 2
    kept = successor(ancestor, 1, 3, "P")
    assert kept.lineage[0][0] == ancestor.lineage[0][0]
    assert left.state_rank(kept.state_tag) is None  # epoch 3 is past left's fork point
    # after the heal, the higher term's planner goes on: the kept half's states stay refused
    healed = successor(left, 2, 2, "Q")
    assert healed.state_rank(kept.state_tag) is None
    assert healed.state_rank(left.state_tag) == 0 and healed.state_rank(ancestor.state_tag) == 1


def test_the_lineage_is_bounded_and_keeps_its_newest_entries() -> None:
    current = successor(None, 1, 1, "P")
    for term in range(2, 2 * MAX_LINEAGE):
        current = successor(current, term, 1, f"P{term}")
    assert len(current.lineage) == MAX_LINEAGE
    assert Plan.from_dict(current.to_dict()) == current


def test_a_plan_without_a_lineage_uses_only_root_states() -> None:
    static = plan(0, 0, "static", ())
    assert static.state_tag is None and static.state_rank(None) == 0
    assert static.state_rank("0123456789abcdef-e1") is None
    assert "lineage" not in static.to_dict()  # an old peer reads it as before


@pytest.mark.parametrize(
    "lineage",
    [
        "x",
        [["0123456789abcdef", 4]],  # the first entry must be at the plan's epoch (5)
        [["0123456789abcdef", 5], ["0123456789abcdef", 3]],  # an id twice
        [["0123456789ABCDEF", 5]],
        [["0123456789abcdef\n", 5]],  # `$` alone would take it: a tag no listing finds
        [["0123456789abcdef", 5, 1]],
        [["0123456789abcdef", -1]],
        [["0123456789abcdef", 5]] + [[f"{i:016x}", 1] for i in range(1, MAX_LINEAGE + 1)],
    ],
)
def test_a_malformed_lineage_is_a_wire_error(lineage: object) -> None:
    with pytest.raises(WireError):
        Plan.from_dict({**plan_dict(), "lineage": lineage})


def test_a_tag_parses_only_whole() -> None:
    assert parse_tag("0123456789abcdef-e5") == ("0123456789abcdef", 5)
    for bad in ("0123456789abcdef-e5\n", "0123456789abcdef-e5 ", "x0123456789abcdef-e5", ""):
        assert parse_tag(bad) is None, repr(bad)
