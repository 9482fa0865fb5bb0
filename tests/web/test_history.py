"""The dashboard's history: a point per step every replica finished, and the swarm's events."""

from __future__ import annotations

import dataclasses

from p2ptrain.records import SwarmStatus
from p2ptrain.web.history import SwarmHistory, measured_step_s, plan_text
from tests.web.synthetic import peer_ids, swarm


def _kinds(history: SwarmHistory) -> list[str]:
    return [e.kind for e in history.events]


def _with_step(status: SwarmStatus, peer: str, step: int, loss: float) -> SwarmStatus:
    peers = tuple(
        dataclasses.replace(p, metrics=dataclasses.replace(p.metrics, step=step, loss=loss))
        if p.id == peer and p.metrics is not None
        else p
        for p in status.peers
    )
    return dataclasses.replace(status, peers=peers)


def test_first_sight_gives_joins_the_election_and_the_plan_with_its_reason() -> None:
    history = SwarmHistory()
    history.observe(swarm(8), 100.0)
    assert _kinds(history) == ["join"] * 8 + ["election", "plan"]
    assert "first plan" in history.events[-1].text and "2 × 4" in history.events[-1].text


def test_a_death_a_return_a_leave_and_a_replan_with_its_predicted_gain() -> None:
    ids = peer_ids(8)
    history = SwarmHistory()
    history.observe(swarm(8, ids=ids), 1.0)
    history.observe(swarm(8, ids=ids, dead=frozenset({ids[3]})), 2.0)
    history.observe(swarm(8, ids=ids), 3.0)
    history.observe(swarm(7, stages=1, ids=ids[:7], epoch=2, reason="members"), 4.0)
    assert _kinds(history)[10:] == ["death", "back", "leave", "plan"]
    assert history.events[10].peer == ids[3] and history.events[12].peer == ids[7]
    replan = history.events[-1].text
    assert "members changed" in replan and "2.500 → 1.250 s" in replan and "+50% faster" in replan


def test_a_new_term_is_an_election() -> None:
    ids = peer_ids(4)
    history = SwarmHistory()
    history.observe(swarm(4, ids=ids), 1.0)
    history.observe(swarm(4, ids=ids, term=2), 2.0)
    assert _kinds(history).count("election") == 2
    assert history.events[-2].text.endswith("term 2")


def test_a_point_when_the_slowest_replica_reports_a_newer_step() -> None:
    ids = peer_ids(8)
    base = swarm(8, ids=ids, step=4)  # 2 replicas, their last stages: ids[3], ids[7]
    history = SwarmHistory()
    history.observe(base, 1.0)
    assert [(p.step, round(p.loss, 3)) for p in history.points] == [(4, 4.96)]
    ahead = _with_step(base, ids[3], 5, 4.0)  # replica 0 at step 5, replica 1 still at 4
    history.observe(ahead, 2.0)
    assert [p.step for p in history.points] == [4]
    both = _with_step(ahead, ids[7], 5, 3.0)
    history.observe(both, 3.0)
    assert [(p.step, p.loss) for p in history.points] == [(4, 4.96), (5, 3.5)]
    assert history.points[-1].tokens_per_s == (100 + 3) + (100 + 7)
    history.observe(both, 4.0)  # nothing new: no new point
    assert len(history.points) == 2


def test_a_liars_huge_step_stops_the_chart_only_until_the_next_plan() -> None:
    """Steps only grew: one replica's last stage saying step 10**15 dropped every later point
    for the node's life."""
    ids = peer_ids(4)  # one replica: its last stage, ids[3], is the step's only source
    history = SwarmHistory()
    history.observe(swarm(4, ids=ids, step=4), 1.0)
    history.observe(_with_step(swarm(4, ids=ids, step=5), ids[3], 10**15, 4.0), 2.0)
    history.observe(swarm(4, ids=ids, step=6), 3.0)  # the same plan: below the lie, dropped
    assert [p.step for p in history.points] == [4, 10**15]
    history.observe(swarm(4, ids=ids, step=7, epoch=2, reason="members"), 4.0)  # a new plan
    history.observe(swarm(4, ids=ids, step=7, epoch=2, reason="members"), 5.0)  # nothing new
    history.observe(swarm(4, ids=ids, step=8, epoch=2, reason="members"), 6.0)
    assert [p.step for p in history.points] == [4, 10**15, 7, 8]
    history.observe(swarm(4, ids=ids, step=6, epoch=2, reason="members"), 7.0)  # re-run, same plan
    assert [p.step for p in history.points][-1] == 8


def test_a_step_past_the_runs_last_is_no_step() -> None:
    """A status that says the run's `steps` bounds the lie within its plan too."""
    ids = peer_ids(4)
    history = SwarmHistory()
    bounded = dataclasses.replace(swarm(4, ids=ids, step=5), run_steps=1000)
    history.observe(dataclasses.replace(swarm(4, ids=ids, step=4), run_steps=1000), 1.0)
    history.observe(_with_step(bounded, ids[3], 10**15, 4.0), 2.0)  # its only source lies
    history.observe(dataclasses.replace(swarm(4, ids=ids, step=6), run_steps=1000), 3.0)
    assert [p.step for p in history.points] == [4, 6]


def test_history_is_bounded() -> None:
    ids = peer_ids(4)
    history = SwarmHistory(max_points=3, max_events=5)
    for step in range(10):
        history.observe(swarm(4, ids=ids, step=step, epoch=step + 1, reason="drift"), step)
    assert [p.step for p in history.points] == [7, 8, 9] and len(history.events) == 5


def test_measured_step_and_plan_text() -> None:
    status = swarm(8)
    assert measured_step_s(status) == 0.5
    assert status.plan is not None
    assert "step 0.55 s predicted" in plan_text(status.plan)


def test_replicas_at_different_steps_give_the_slowest_step_and_their_mean_loss() -> None:
    ids = peer_ids(8)
    history = SwarmHistory()
    history.observe(_with_step(_with_step(swarm(8, ids=ids), ids[3], 7, 4.0), ids[7], 6, 3.0), 1.0)
    assert [(p.step, p.loss) for p in history.points] == [(6, 3.5)]


def test_a_node_that_said_it_was_stopping_left_it_did_not_die() -> None:
    """Every graceful stop, and every node's exit at a run's end, was a "death: stopped
    answering" on the page; the node had told the swarm it was stopping (control/publishing.py)."""
    from p2ptrain.records import Health
    from p2ptrain.records.peer import LEAVING_REASON

    ids = peer_ids(8)
    history = SwarmHistory()
    history.observe(swarm(8, ids=ids), 1.0)
    stopping = swarm(8, ids=ids)
    peers = tuple(
        dataclasses.replace(p, health=Health(False, LEAVING_REASON)) if p.id == ids[2] else p
        for p in stopping.peers
    )
    history.observe(dataclasses.replace(stopping, peers=peers), 2.0)
    history.observe(swarm(8, ids=ids, dead=frozenset({ids[2], ids[5]})), 3.0)
    late = list(history.events)[-2:]
    assert [(e.kind, e.peer) for e in late] == [("leave", ids[2]), ("death", ids[5])]
    assert "said it was stopping" in late[0].text
