"""A finished run is finished for everyone (control/run_end.py), and a waiting node says what it
waits for (control/waiting.py, control/run_watch.py). Pure rules, a fake clock."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from p2ptrain.control import view as view_mod
from p2ptrain.control.candidacy import ELECTION_GRACE_S, should_claim
from p2ptrain.control.planning.plan_maker import PLAN_DEBOUNCE_S, PlanMaker
from p2ptrain.control.run_end import RunEnd
from p2ptrain.control.run_watch import FINISHED_GRACE_S, NO_PLANNER_WARN_S, RunWatch
from p2ptrain.control.state import NodeState
from p2ptrain.control.status import swarm_status
from p2ptrain.control.term_learning import learn_term
from p2ptrain.control.waiting import TOKENS_HEARD_S, waiting_for
from p2ptrain.errors import UserError
from p2ptrain.records import PeerMetrics, RunSpec, SwarmStatus, issue_revocation
from tests.control.test_view import ME, ORGANISER, A, B, C, make_view, plan, record

RUN = RunSpec().replace(
    run_id="end", stages=1, n_layer=2, steps=20, min_peers=1, compute_aware=False
)


def step(n: int) -> dict[str, Any]:
    """Telemetry whose metrics report step `n` done."""
    return {"links": {}, "metrics": {"step": n, "stage": 0, "replica": 0}}


def planned_view(me: str = ME, placed: tuple[str, ...] = (A, B), spares: tuple[str, ...] = ()):
    """A view following planner A's plan (term 1) that places `placed`, `spares` left out."""
    v, feed = make_view(me=me, peers=tuple(p for p in (A, B, C) if p != me))
    v.run = RUN
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    body = {**plan(A, 1, 1, placed), "spares": list(spares)}
    assert v.accept(feed("plan", A, body), 1.0) is None
    return v, feed


def settled(v: view_mod.SwarmView, now: float) -> bool:
    """One tick of the node's run watch at `now` (it settles the run's end): is it finished?"""
    watch(v).tick(now)
    return v.finished


def planner_of(peers: tuple[str, ...]) -> tuple[view_mod.SwarmView, Any, set[str], Any]:
    """A's view as the planner of `peers`; `tick(now)` hears from the peers still in `alive`
    and runs A's plan maker once."""
    v, feed = make_view(me=A, peers=peers)
    v.run = RUN
    v.claim()
    maker = PlanMaker(v, A)
    alive = set(peers)

    async def tick(now: float) -> bool:
        for peer in alive:
            assert v.accept(feed("peer", peer, record()), now) is None
        return await maker.tick(now, [])

    return v, feed, alive, tick


def test_the_run_ends_once_every_placed_replica_trained_its_last_step() -> None:
    # diloco: each replica at its own pace. B is first to its last step; A still trains
    v, feed = planned_view(placed=(A, B), spares=(C,))
    assert v.accept(feed("telemetry", C, step(19)), 2.0) is None
    assert not settled(v, 2.0)  # a spare trains nothing: its word ends nothing
    assert v.accept(feed("telemetry", B, step(18)), 2.0) is None
    assert not settled(v, 2.0)  # one step left
    assert v.accept(feed("telemetry", B, step(19)), 2.0) is None
    assert v.accept(feed("telemetry", A, step(15)), 3.0) is None
    assert not settled(v, 3.0)  # A, placed and alive, still trains: the run waits for it
    assert v.run_end.done_in(v.run, v.plan) == {B}
    # B's node leaves after its last step; its last metrics stay known, A trains on
    late = 3.0 + view_mod.DEAD_AFTER_S + 1.0
    assert v.accept(feed("telemetry", A, step(18)), late) is None
    assert not v.is_alive(B, late) and not settled(v, late)
    assert v.accept(feed("telemetry", A, step(19)), late + 1.0) is None
    assert settled(v, late + 1.0)
    assert v.run_end.how == "step 20 of 20 trained by every placed peer"
    # the same run continued with more steps (a new run spec after a restart) is not finished
    v.run = RUN.replace(steps=40)
    assert not v.finished


def test_a_placed_peer_lost_before_its_last_step_does_not_hold_the_end_up() -> None:
    v, feed = planned_view(placed=(A, B))
    assert v.accept(feed("telemetry", A, step(12)), 2.0) is None
    late = 2.0 + view_mod.DEAD_AFTER_S + 1.0
    assert not settled(v, late)  # both silent, but nobody trained the last step: no end
    assert v.accept(feed("telemetry", B, step(19)), late) is None
    assert settled(v, late)  # A died at step 12
    assert "(1 reported it, 1 gone before)" in v.run_end.how
    # a placed peer whose worker is unhealthy (planned around) holds it up no more either
    v, feed = planned_view(placed=(A, B))
    assert v.accept(feed("telemetry", B, step(19)), 2.0) is None
    assert not settled(v, 2.0)
    stuck = {**step(12), "health": {"ok": False, "reason": "stuck"}}
    assert v.accept(feed("telemetry", A, stuck), 2.5) is None
    assert settled(v, 2.5)


def test_a_placed_peers_metrics_before_its_plan_count() -> None:
    # B's last telemetry came in before the plan that places it (sync's order, a late joiner)
    v, feed = make_view(me=ME, peers=(A, B))
    v.run = RUN
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert v.accept(feed("telemetry", B, step(19)), 1.0) is None
    assert v.accept(feed("plan", A, plan(A, 1, 1, (B,))), 1.5) is None
    assert settled(v, 1.5)


def test_our_own_worker_and_the_organiser_may_say_it() -> None:
    end = RunEnd()
    never = lambda peer: None  # noqa: E731
    assert not end.note_metrics(RUN, ME, PeerMetrics(step=19), None)  # not placed in any plan
    assert end.note_metrics(RUN, ME, PeerMetrics(step=19), None, own=True)
    assert not end.note_metrics(RUN, ME, PeerMetrics(step=19), None, own=True)  # once
    assert end.settle(RUN, None, never, lambda peer: False)
    assert end.is_finished(RUN) and not end.is_finished(RUN.replace(steps=21))
    # our worker's last step, with another placed replica still training: not yet
    v, _ = planned_view(placed=(A, ME))
    v.own_metrics = PeerMetrics(step=19)
    assert not settled(v, 2.0) and v.run_end.done_in(v.run, v.plan) == {ME}
    organiser = RunEnd()
    assert not organiser.note_organiser(RUN, "yes") and not organiser.note_organiser(RUN, False)
    assert organiser.note_organiser(RUN, True) and organiser.is_finished(RUN)


def test_a_finished_run_gets_no_new_plan_and_no_claim() -> None:
    # A plans for A, B, C; all three report the last step; then C leaves: no plan
    v, feed, alive, tick = planner_of((B, C))

    async def scenario() -> list[bool]:
        made = [await tick(1.0), await tick(1.0 + PLAN_DEBOUNCE_S + 0.1)]
        assert v.plan is not None and v.plan.peers() == {A, B, C}
        for peer in (B, C):
            assert v.accept(feed("telemetry", peer, step(19)), 3.0) is None
        v.own_metrics = PeerMetrics(step=19)
        assert settled(v, 3.0)
        alive.discard(C)
        late = 3.0 + view_mod.DEAD_AFTER_S + 1.0
        return [*made, await tick(late), await tick(late + PLAN_DEBOUNCE_S + 0.1)]

    assert trio.run(scenario) == [False, True, False, False]
    assert v.plan is not None and (v.plan.term, v.plan.epoch) == (1, 1)
    # a spare whose planner left does not claim a finished run
    w, _ = planned_view(me=B, placed=(A,), spares=(B,))
    w.run_end.note_organiser(w.run, True)
    assert not should_claim(w, 2.0 + view_mod.DEAD_AFTER_S + ELECTION_GRACE_S)


def test_a_replica_done_and_gone_is_not_re_planned_a_lost_one_is() -> None:
    # bench scaleout run 6: under diloco the fastest replica (B) trained the last step and
    # left; the planner re-planned the others, which lost their last steps
    v, feed, alive, tick = planner_of((B, C, ME))

    async def scenario() -> list[bool]:
        made = [await tick(1.0), await tick(1.0 + PLAN_DEBOUNCE_S + 0.1)]
        assert v.plan is not None and v.plan.peers() == {A, B, C, ME}
        assert v.accept(feed("telemetry", B, step(19)), 3.0) is None
        alive.discard(B)  # done: its node leaves
        late = 3.0 + view_mod.DEAD_AFTER_S + 1.0
        last_heard = late + PLAN_DEBOUNCE_S + 0.1
        made += [await tick(late), await tick(last_heard)]
        alive.discard(C)  # C dies at step 17: lost, re-planned without B, even were it back
        alive.add(B)
        assert v.accept(feed("telemetry", C, step(17)), last_heard) is None
        later = last_heard + view_mod.DEAD_AFTER_S + 1.0
        return [*made, await tick(later), await tick(later + PLAN_DEBOUNCE_S + 0.1)]

    assert trio.run(scenario) == [False, True, False, False, False, True]
    assert v.plan is not None and v.plan.epoch == 2 and v.plan.peers() == {A, ME}
    assert not v.finished  # A and ME still train


def test_what_a_node_waits_for() -> None:
    # no member holds a planner token: the command that issues one, for this peer (once the
    # members' records had time to arrive: a joiner's first seconds are the election's)
    v, feed = make_view(me=ME, peers=(A, B), now=-TOKENS_HEARD_S)
    v.run, v.authority.own_token = RUN, None
    for peer in (A, B):
        assert v.accept(feed("peer", peer, {**record(), "token": None}), 1.0) is None
    wait = waiting_for(v, 1.0)
    assert wait.kind == "planner-token"
    assert f"p2ptrain token issue --identity BOOTSTRAP.key --peer {ME} --run-id end --planner" in (
        wait.text
    )
    assert waiting_for(v, -TOKENS_HEARD_S + 1.0).kind == "planner"  # just joined
    # a revoked peer is never the one to issue a token to: "there is no un-revoke"
    v.authority.revocations[ME] = issue_revocation(ORGANISER, ME)
    assert f"--peer {A} " in waiting_for(v, 1.0).text
    # fewer than min_peers alive
    v, feed = make_view(me=ME, peers=(A,))
    v.run = RUN.replace(min_peers=3)
    assert waiting_for(v, 1.0).text == "peers: 2 of the run's min_peers 3 alive"
    assert waiting_for(v, 1.0).kind == "peers"
    # a member's step is its own word: the run is not under way for it
    v.members[A].metrics = PeerMetrics(step=1320)
    assert waiting_for(v, 1.0).kind == "peers"
    # the organiser says a plan was out: min_peers gated the run's first plan only, not a new
    # planner's (a restarted planner waited for the full swarm again, 1,320 steps in)
    assert v.bootstrap_id is not None
    assert v.accept(feed("peer", v.bootstrap_id, {**record(), "planned": True}), 1.0) is None
    assert waiting_for(v, 1.0).kind != "peers"
    # a planner-token holder that does not know the organiser's term yet says so
    v, _ = make_view(me=ME, peers=(A,), anchor=None)
    v.run = RUN.replace(min_peers=2)
    assert waiting_for(v, 1.0).text == "the planner election (the organiser's current term)"
    learn_term(v, v.bootstrap_id, 0)
    assert waiting_for(v, 1.0).text == "the planner election"
    # links still being measured, counted
    v, feed = make_view(me=ME, peers=(A, B))
    v.run, v.role = RUN.replace(min_peers=3), "trainer"
    for peer in (A, B):
        body = {**record("trainer"), "data_addrs": ["/ip4/10.0.0.1/tcp/7402"]}
        assert v.accept(feed("peer", peer, body), 1.0) is None
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    wait = waiting_for(v, 1.0)
    assert wait.kind == "measurements" and "3 of 3 links" in wait.text
    # a newcomer to a run under way waits for a plan that places it, not for "the first plan";
    # under way: a plan of the run was out (members' steps are their own word, not enough)
    v.members[B].metrics = v.members[A].metrics = PeerMetrics(step=1321)
    assert waiting_for(v, 1.0).kind == "measurements"
    v.run_planned = True  # the organiser's record said so, or a token holder's plan was seen
    assert waiting_for(v, 1.0).text == f"a plan that places this peer ({A} is making it)"
    # a spare, a placed peer, a finished run
    v, _ = planned_view(placed=(A, B), spares=(ME,))
    assert waiting_for(v, 2.0).kind == "place"
    v, _ = planned_view(placed=(A, ME))
    assert waiting_for(v, 2.0).kind == ""
    v.run_end.note_organiser(v.run, True)
    wait = waiting_for(v, 2.0)
    assert wait.kind == "finished" and "run end is finished" in wait.text
    # and the status document says the same, through its JSON
    status = SwarmStatus.from_dict(swarm_status(v, 2.0).to_dict())
    assert status.finished and status.waiting == "finished" and status.waiting_for == wait.text


def watch(v: view_mod.SwarmView, role: str = "trainer") -> RunWatch:
    state = NodeState(seed=b"", role=role, peer_id=v.self_id, host=None, view=v, hardware={})  # type: ignore[arg-type]
    return RunWatch(state)


def test_a_spare_says_it_once_and_leaves_when_the_run_finishes(capsys) -> None:
    v, feed = planned_view(placed=(A, B), spares=(ME,))
    w = watch(v)
    for now in (2.0, 2.5, 3.0):
        w.tick(now)
    assert capsys.readouterr().out.count("waiting for a place in the plan") == 1
    assert not w.state.stopping.is_set()
    assert v.accept(feed("telemetry", B, step(19)), 3.0) is None
    w.tick(3.5)
    assert not w.state.stopping.is_set()  # A still trains its last steps
    assert v.accept(feed("telemetry", A, step(19)), 4.0) is None
    w.tick(4.0)
    assert w.state.stopping.is_set()
    out = capsys.readouterr().out
    assert "waiting for nothing: run end is finished" in out and "stopping" in out


def test_a_placed_peer_gossips_its_last_step_and_leaves_after_its_worker() -> None:
    v, feed = planned_view(placed=(A, ME))
    w = watch(v)
    v.own_metrics = PeerMetrics(step=19)
    w.tick(2.0)
    assert not v.finished and w.state.due["telemetry"] == 0.0  # published at the next tick
    assert v.accept(feed("telemetry", A, step(19)), 2.5) is None
    w.tick(2.5)
    assert v.finished and not w.state.stopping.is_set()  # our worker saves and ends the node
    w.tick(2.5 + FINISHED_GRACE_S)
    assert w.state.stopping.is_set()  # unless it hangs


def test_a_lagging_placed_replica_is_not_stopped_while_it_trains() -> None:
    v, feed = planned_view(placed=(A, ME), spares=(C,))
    w = watch(v)
    assert v.accept(feed("telemetry", A, step(19)), 2.0) is None  # A's replica is first
    for now in (2.0, 2.0 + FINISHED_GRACE_S, 2.0 + 3 * FINISHED_GRACE_S):
        v.own_metrics = PeerMetrics(step=15)
        w.tick(now)
    assert not v.finished and not w.state.stopping.is_set()
    assert waiting_for(v, 200.0).kind == ""  # placed: training
    v.own_metrics = PeerMetrics(step=19)
    w.tick(300.0)
    assert v.finished and not w.state.stopping.is_set()
    w.tick(300.0 + FINISHED_GRACE_S)
    assert w.state.stopping.is_set()


def test_the_bootstrap_warns_once_a_minute_while_no_member_may_plan(caplog) -> None:
    v, feed = make_view(me=ME, peers=(A,))
    v.run, v.role = RUN, "bootstrap"
    w = watch(v, "bootstrap")
    caplog.set_level(logging.INFO)
    times = (1.0, 2.0, 30.0, 1.0 + NO_PLANNER_WARN_S)
    for now in times:
        assert v.accept(feed("peer", A, {**record(), "token": None}), now) is None
        w.tick(now)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "no member holds a planner token" in warnings[0].message
    assert not w.state.stopping.is_set()


def test_status_text_says_finished_and_what_it_waits_for() -> None:
    from p2ptrain.cli.status_cmd import format_status
    from tests.records.samples import status_dict

    text = format_status(SwarmStatus.from_dict(status_dict()))
    assert text.splitlines()[-1] == "waiting for a place in the plan"
    done = {**status_dict(), "finished": True, "waiting": "finished", "waiting_for": "nothing"}
    text = format_status(SwarmStatus.from_dict(done))
    assert text.splitlines()[0].endswith("   finished")


def test_a_revoked_peer_leaves_a_token_run_and_is_told_in_an_open_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A node whose tokens the organiser revoked was never told: in a token run it waited for
    a plan naming it for good (every other view had dropped it)."""
    revocation = issue_revocation(ORGANISER, ME)
    v, _ = make_view(me=ME, peers=(A, B))
    v.run = RUN.replace(admission="token")
    v.authority.revocations[ME] = revocation
    with pytest.raises(UserError, match="the organiser revoked this peer's tokens"):
        watch(v).tick(1.0)
    v, _ = make_view(me=ME, peers=(A, B))
    v.run = RUN
    v.authority.revocations[ME] = revocation
    watching = watch(v)
    watching.tick(1.0)
    watching.tick(2.0)  # said once
    said = capsys.readouterr().out
    assert said.count("the organiser revoked this peer's tokens: it trains as a member") == 1


def test_a_new_planner_of_a_run_under_way_does_not_wait_for_min_peers() -> None:
    """A planner restarted mid-run holds no plan: it waited for the run's min_peers, which
    gates the first plan only, and the swarm stood still until a third peer came."""
    v, feed, _, tick = planner_of((B,))
    v.run = RUN.replace(min_peers=3)

    async def scenario() -> list[bool]:
        waited = await tick(1.0)  # a fresh run: 2 of 3
        assert v.accept(feed("telemetry", B, step(1320)), 1.1) is None
        assert not await tick(1.15)  # a member's step is its own word
        assert v.bootstrap_id is not None  # the organiser's record: a plan of the run was out
        said = {**record("bootstrap"), "planned": True}
        assert v.accept(feed("peer", v.bootstrap_id, said), 1.15) is None
        seen = await tick(1.2)  # the members' change, debounced
        return [waited, seen, await tick(1.2 + PLAN_DEBOUNCE_S + 0.1)]

    assert trio.run(scenario) == [False, False, True]
    assert v.plan is not None and v.plan.peers() == {A, B}


def test_a_placed_member_whose_session_ended_says_it_waits_for_a_new_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its pipeline lost a peer: the worker waits for the next plan, and the node's last
    stdout line stayed a step line for minutes (a walk-through)."""
    v, _ = planned_view(placed=(ME, B))
    assert v.plan is not None
    watching = watch(v)
    watching.state.worker.heard(1.0, (v.plan.term, v.plan.epoch, "training", 40))
    watching.tick(1.0)
    assert "waiting" not in capsys.readouterr().out  # training: nothing to say
    watching.state.worker.heard(2.0, (v.plan.term, v.plan.epoch, "waiting", 41))
    watching.tick(2.0)
    said = capsys.readouterr().out
    key = f"t{v.plan.term}/e{v.plan.epoch}"
    assert "waiting for a new planner" in said or "waiting for a new plan" in said
    assert key in said
