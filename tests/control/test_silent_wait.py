"""A member whose start agreement never heard some of the plan, and that the next plan leaves
out, says so while it waits (control/waiting.py): the planner may leave a member most of a
plan never heard out for 10-40 min (control/planning/silent_start.py), perhaps this one."""

from __future__ import annotations

from p2ptrain.control.candidacy import ELECTION_GRACE_S
from p2ptrain.control.waiting import waiting_for
from p2ptrain.records import PeerMetrics, Plan, RunSpec
from tests.control.test_view import A, B, make_view


def test_a_member_left_out_after_a_failed_start_agreement_says_why_it_may_be() -> None:
    v, feed = make_view(peers=(A, B))
    v.run = RunSpec()
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    plan = Plan(
        term=1,
        epoch=2,
        planner=A,
        stages=1,
        pipelines=((A,), (B,)),
        spares=(),
        data_addrs={},
        cost_s=1.0,
    )
    v.plan = plan
    now = ELECTION_GRACE_S
    assert "re-plans after a join" in waiting_for(v, now).text
    v.own_metrics = PeerMetrics(silent=(A, B), silent_plan=(1, 1))
    wait = waiting_for(v, now)
    assert wait.kind == "plan"
    assert "plan t1/e1 never heard 2 of its members" in wait.text and "10-40 min" in wait.text


def test_the_status_shows_whom_a_plan_member_never_heard_under_that_plan_only() -> None:
    """Up to 64 ids from each of 10,000 peers would pass the status readers' 64 MiB."""
    from p2ptrain.control.status import swarm_status
    from p2ptrain.control.view import Member

    v, _ = make_view(peers=(A, B))
    v.run = RunSpec()
    v.plan = Plan(
        term=1,
        epoch=2,
        planner=A,
        stages=1,
        pipelines=((A,),),
        spares=(),
        data_addrs={},
        cost_s=1.0,
    )
    said = PeerMetrics(silent=(B,), silent_plan=(1, 2))
    for peer in (A, B):
        member = v.members[peer]
        v.members[peer] = Member(member.record, member.last_heard, said, member.health)
    shown = {p.id: p.metrics for p in swarm_status(v, 1.0).peers}
    assert shown[A] is not None and shown[A].silent == (B,)  # the plan's, under it
    assert shown[B] is not None and shown[B].silent == ()  # not a peer of the plan
