"""Past the full mesh an honest telemetry row names its neighbour set (at most 12 peers), but a
row may name up to 1,024 ids, made-up or real, and the planner walked every entry every tick:
a row is kept to MAX_ROW_ENTRIES (members first, then those that say something, freshest
first), made-up ids never reach the planner's links, freshest() is remembered while nothing
changed, and drift past the full mesh is judged on the plan's links only."""

from __future__ import annotations

import random

import pytest

from p2ptrain.control import links as links_mod
from p2ptrain.control.estimate.book import FULL_MESH_PEERS, plan_links
from p2ptrain.control.links import MAX_ROW_ENTRIES, Link, LinkTable
from p2ptrain.control.planning.drift import SAMPLED_DRIFT_DWELL_S, DriftWatch, links_drifted
from p2ptrain.records import LinkReport, Plan, Telemetry

ME = "Peer000"
MEASURED = LinkReport(20.0, 1.0, 50.0, 2.0)


def peers(n: int) -> list[str]:
    return [f"Peer{i:03d}" for i in range(n)]


def big_table(n: int = 40) -> LinkTable:
    """Our table in a swarm of `n` members, each of whose rows we hold (one honest link each)."""
    table = LinkTable(ME)
    members = peers(n)
    for i, peer in enumerate(members[1:], start=1):
        other = members[i % (n - 1) + 1]
        table.note_telemetry(peer, Telemetry({other: MEASURED}), 0.0)
    return table


def test_a_row_naming_hundreds_of_ids_keeps_its_members_entries_only() -> None:
    table = big_table()
    real = peers(40)[2:12]  # ten real members among 590 made-up ids
    made_up = {f"Fake{i:04d}": MEASURED for i in range(580)}
    row = {**made_up, **{p: MEASURED for p in real}}
    table.note_telemetry("Peer001", Telemetry(row), 1.0)
    kept = table.rows["Peer001"][0]
    assert len(kept) == MAX_ROW_ENTRIES
    assert set(real) <= set(kept)  # the members first
    links = table.freshest(1.5)
    assert not any(p.startswith("Fake") for pair in links for p in pair)  # never reach the planner
    assert {("Peer001", p) for p in real} <= set(links)


def test_an_honest_row_is_kept_whole_and_a_members_silent_entries_go_first() -> None:
    table = big_table()
    honest = {p: MEASURED for p in peers(40)[20:32]}  # a neighbour set of 12
    table.note_telemetry("Peer005", Telemetry(honest), 1.0)
    assert table.rows["Peer005"][0] == honest
    failing = {p: LinkReport(None, None, None, None, rtt_failures=3) for p in peers(40)[2:6]}
    silent = {p: LinkReport(None, None, None, None) for p in peers(40)[6:14]}
    fresh = {p: LinkReport(10.0, 0.5, None, None) for p in peers(40)[14:22]}
    table.note_telemetry("Peer001", Telemetry({**silent, **failing, **fresh}), 2.0)
    kept = table.rows["Peer001"][0]
    assert set(failing) | set(fresh) <= set(kept)  # failures are the link's last word: kept
    assert len(kept) == MAX_ROW_ENTRIES


def test_a_row_naming_its_author_loses_that_entry() -> None:
    table = big_table()
    table.note_telemetry("Peer001", Telemetry({"Peer001": MEASURED, "Peer002": MEASURED}), 1.0)
    assert set(table.rows["Peer001"][0]) == {"Peer002"}


def test_a_full_mesh_keeps_rows_whole_as_before() -> None:
    table = LinkTable(ME)
    members = peers(FULL_MESH_PEERS)
    row = {f"Gone{i:02d}": MEASURED for i in range(30)}  # peers we no longer hold rows of
    table.note_telemetry(members[1], Telemetry(row), 0.0)
    assert table.rows[members[1]][0] == row
    assert len(table.freshest(0.5)) == 30


def test_rows_stored_whole_before_the_swarm_grew_do_not_name_made_up_ids() -> None:
    table = LinkTable(ME)
    table.note_telemetry("Peer001", Telemetry({f"Fake{i:04d}": MEASURED for i in range(500)}), 0.0)
    assert len(table.rows["Peer001"][0]) == 500  # a small swarm then: kept whole
    for peer in peers(30)[2:]:
        table.note_telemetry(peer, Telemetry({"Peer001": MEASURED}), 0.0)
    links = table.freshest(0.5)
    assert not any(p.startswith("Fake") for pair in links for p in pair)
    assert len(links) == 28


def test_freshest_is_computed_again_only_after_a_change_or_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = big_table()
    calls = []
    real = links_mod.freshest_links

    def counted(*args: object, **kwargs: object) -> dict[tuple[str, str], Link]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(links_mod, "freshest_links", counted)
    first = table.freshest(1.0)
    assert table.freshest(1.2) == first and table.freshest(1.9) == first
    assert len(calls) == 1  # the planner's ticks within the second: one merge
    table.note_telemetry("Peer003", Telemetry({"Peer004": LinkReport(99.0, 0.0, None, None)}), 1.9)
    changed = table.freshest(1.9)
    assert len(calls) == 2 and changed[("Peer003", "Peer004")].rtt_ms == 99.0
    table.record_rtt("Peer007", 12.0, 1.95)  # our own samples count as a change too
    assert table.freshest(1.95)[(ME, "Peer007")].rtt_ms == 12.0 and len(calls) == 3
    table.freshest(3.0)  # a second later: again
    assert len(calls) == 4
    table.forget("Peer003")
    assert ("Peer003", "Peer004") not in table.freshest(3.0) and len(calls) == 5


def test_steady_links_of_many_members_do_not_hide_the_plans_drift() -> None:
    """20% of 1,000 members each naming 450 steady links diluted the drift of every honest
    link below the fraction; past the full mesh only the plan's links count."""
    rng = random.Random(0)
    members = [f"P{i:04d}" for i in range(1000)]
    honest, hostile = members[200:], members[:200]
    pipelines = [tuple(honest[r * 4 : r * 4 + 4]) for r in range(8)]
    placed = plan_links(pipelines)
    before: dict[tuple[str, str], Link] = {}
    now: dict[tuple[str, str], Link] = {}
    for pair in placed:  # every placed link 6x slower, 10x narrower
        before[pair], now[pair] = Link(10.0, 100.0, 1.0), Link(60.0, 10.0, 1.0)
    for sybil in hostile:
        for other in rng.sample(members, 450):
            if other != sybil:
                pair = (min(sybil, other), max(sybil, other))
                before[pair] = now[pair] = Link(10.0, 100.0, 1.0)
    assert not links_drifted(before, now, members)  # what every plannable member's link said
    assert links_drifted(before, now, members, placed)


def test_the_planner_judges_drift_past_the_full_mesh_on_its_plans_links() -> None:
    members = peers(40)
    pipelines = (tuple(members[0:4]), tuple(members[4:8]))
    plan = Plan(1, 1, ME, 4, pipelines, (), {}, 1.0)
    watch = DriftWatch()
    steady = {
        (a, b): Link(10.0, 100.0, 1.0) for i, a in enumerate(members) for b in members[i + 1 :]
    }
    placed = plan_links(pipelines)
    worse = {**steady, **{pair: Link(60.0, 10.0, 1.0) for pair in placed}}
    watch.planned(steady, 0.0)
    assert len(placed) < 0.25 * len(steady)  # a minority of the members' links
    assert watch.drifted(SAMPLED_DRIFT_DWELL_S + 1.0, worse, members, plan)
