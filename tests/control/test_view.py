"""Election, plan acceptance, replay, penalty and link rules of SwarmView, with a fake clock."""

from __future__ import annotations

import pytest

from p2ptrain import identity
from p2ptrain.control import links as links_mod
from p2ptrain.control import view as view_mod
from p2ptrain.control import wire
from p2ptrain.control.candidacy import ELECTION_GRACE_S, should_claim
from p2ptrain.control.links import RECENT_RATES, RECENT_RTTS, RECENT_WINDOW_S
from p2ptrain.control.penalties import BLOCK_S
from p2ptrain.control.status import swarm_status
from p2ptrain.control.term_learning import learn_term
from p2ptrain.control.view import SwarmView
from p2ptrain.control.wire import Envelope
from p2ptrain.records import (
    PeerRecord,
    RunSpec,
    SwarmStatus,
    Token,
    issue_revocation,
    issue_token,
)
from p2ptrain.records.peer import LEAVING_REASON

A, B, C, ME = "Aaaa", "Bbbb", "Cccc", "Mmmm"  # sorted: A < B < C < M
ORGANISER = bytes(range(32))  # the bootstrap's key: it signs the planner tokens


def planner_token(peer: str) -> Token:
    return issue_token(ORGANISER, peer, True, 2e9)


def record(role: str = "control-only") -> dict:
    return {
        "role": role,
        "planner_capable": role in ("control-only", "trainer"),
        "addrs": [],
        "version": "0",
        "hardware": {},
    }


class Feed:
    """Builds envelopes with growing seq numbers."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, author: str, body: dict) -> Envelope:
        self.seq += 1
        if kind == "peer" and "token" not in body:  # members of these tests may plan
            body = {**body, "token": planner_token(author).encode()}
        record = wire.BODY_RECORDS[kind](body)  # what wire.decode hands the view
        return Envelope(kind=kind, author=author, seq=self.seq, ts=0.0, body=record)


def make_view(
    me: str = ME, peers: tuple[str, ...] = (A, B, C), now: float = 0.0, anchor: int | None = 0
):
    """A view of `peers`, which learnt the current term (`anchor`) from the organiser."""
    v = SwarmView(
        self_id=me,
        role="control-only",
        planner_capable=True,
        started_at=now,
        bootstrap_id=identity.peer_id_of(ORGANISER),
        own_token=planner_token(me),
    )
    if anchor is not None:
        learn_term(v, v.bootstrap_id, anchor)
    feed = Feed()
    for peer in peers:
        assert v.accept(feed("peer", peer, record()), now) is None
    return v, feed


def organiser_view() -> SwarmView:
    """The bootstrap's own view, fresh or restarted: no term known yet."""
    return SwarmView(
        self_id=identity.peer_id_of(ORGANISER),
        role="bootstrap",
        planner_capable=False,
        started_at=0.0,
        bootstrap_id=identity.peer_id_of(ORGANISER),
    )


def plan(planner: str, term: int, epoch: int, peers=(A, B)) -> dict:
    return {
        "term": term,
        "epoch": epoch,
        "planner": planner,
        "stages": 1,
        "pipelines": [[p] for p in peers],
        "spares": [],
        "data_addrs": {},
        "cost_s": 1.0,
    }


def test_smallest_live_candidate_claims_after_the_grace_period():
    v, _ = make_view(me=A, peers=(B, C))
    assert not should_claim(v, 1.0)  # still listening for an incumbent
    assert should_claim(v, ELECTION_GRACE_S + 0.1)
    assert v.claim() == 1 and v.planner == A
    w, _ = make_view(me=C, peers=(A, B))
    assert not should_claim(w, ELECTION_GRACE_S + 0.1)  # A is smaller and alive


def test_failover_after_the_planner_goes_silent():
    v, feed = make_view(me=B, peers=(A, C))
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert v.planner == A and v.term == 1
    t = 1.0 + view_mod.DEAD_AFTER_S + 0.5
    v.accept(feed("peer", C, record()), t)  # C keeps talking, A is silent
    assert not v.is_alive(A, t)
    assert should_claim(v, t)
    assert v.claim() == 2
    assert swarm_status(v, t).planner == B


def test_failover_at_once_when_the_planner_says_it_is_stopping():
    """A planner stopped with Ctrl-C tells the swarm (health: the node is stopping); a new one
    was still elected only after DEAD_AFTER_S of its silence (8 s in a walk-through)."""
    v, feed = make_view(me=B, peers=(A, C))
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    t = ELECTION_GRACE_S + 0.1
    assert not should_claim(v, t)  # A plans
    stopping = {"links": {}, "health": {"ok": False, "reason": LEAVING_REASON}}
    assert v.accept(feed("telemetry", A, stopping), t) is None
    assert v.is_alive(A, t) and should_claim(v, t)  # B, the smallest that stays


def test_an_old_envelope_pulled_by_sync_does_not_raise_a_dead_peer():
    # A went silent at t=1; at t=20 a sync reply hands over A's last envelope, which we had
    # missed: it was signed back then, so A stays dead (a planner re-planned it in for 8 s)
    v, feed = make_view(me=B, peers=(A, C), now=1.0)
    t = 1.0 + view_mod.DEAD_AFTER_S + 11.0
    assert not v.is_alive(A, t)
    assert v.accept(feed("peer", A, record()), t, heard_at=1.0) is None
    assert not v.is_alive(A, t)
    assert v.accept(feed("peer", A, record()), t) is None  # as fresh gossip: alive again
    assert v.is_alive(A, t)


def test_a_higher_term_wins_in_every_view_even_over_a_live_incumbent():
    # the incumbent steps down for a higher term (test below): so must every other view, or
    # the incumbent would follow C while we kept following B
    v, feed = make_view(me=ME, peers=(A, B, C), anchor=2)
    assert v.accept(feed("claim", B, {"term": 3}), 1.0) is None
    assert v.accept(feed("claim", C, {"term": 4}), 1.5) is None  # C thought B dead
    assert (v.planner, v.term) == (C, 4)
    # equal term: the smaller id wins the tie-break
    assert v.accept(feed("claim", B, {"term": 4}), 2.0) is None
    assert v.planner == B


def test_a_peer_that_saw_a_claim_it_could_not_follow_waits_before_claiming():
    # we believe A, the claimer, dead (no word from it for long): its claim is not followed,
    # but we know a term 2 is being claimed, so we (smaller id, so the candidate) do not depose
    # it with term 3 at once
    v, feed = make_view(me="0aaa", peers=(A,))
    t = view_mod.DEAD_AFTER_S + 1.0
    drop = v.accept(feed("claim", A, {"term": 2}), t)
    assert drop is not None and drop.category is None and v.planner is None
    assert not should_claim(v, t + 1.0)
    assert should_claim(v, t + view_mod.DEAD_AFTER_S + 0.1)


def test_planner_steps_down_for_a_higher_term():
    v, feed = make_view(me=A, peers=(B,), anchor=3)
    v.claim()
    assert v.accept(feed("claim", B, {"term": 5}), 1.0) is None
    assert v.planner == B and v.term == 5


def test_plan_from_a_planner_we_do_not_follow_is_not_blamed():
    v, feed = make_view()
    v.accept(feed("claim", A, {"term": 2}), 0.1)
    v.accept(feed("claim", B, {"term": 2}), 0.2)  # loses the tie-break; but B did claim term 2
    drop = v.accept(feed("plan", B, plan(B, 2, 1)), 0.3)
    assert drop is not None and drop.category is None and v.plan is None


def test_claims_from_unknown_or_incapable_peers_are_refused():
    v, feed = make_view(peers=(A,))
    assert v.accept(feed("peer", B, record("bootstrap")), 0.0) is None
    drop = v.accept(feed("claim", B, {"term": 1}), 0.5)
    assert drop is not None and drop.category == "unauthorised"
    drop = v.accept(feed("claim", "Zzzz", {"term": 1}), 0.5)
    assert drop is not None and v.planner is None


def test_plans_only_from_the_planner_and_only_newer():
    v, feed = make_view()
    v.accept(feed("claim", A, {"term": 1}), 0.1)
    assert v.accept(feed("plan", A, plan(A, 1, 1)), 0.2) is None
    assert v.plan.epoch == 1 and v.plan_version == 1
    assert v.accept(feed("plan", A, plan(A, 1, 2)), 0.3) is None
    assert v.plan_version == 2
    assert v.accept(feed("plan", A, plan(A, 1, 2)), 0.4) is None  # re-broadcast: no change
    assert v.plan_version == 2
    stale = v.accept(feed("plan", A, plan(A, 1, 1)), 0.5)
    assert stale is not None and stale.category is None
    rogue = v.accept(feed("plan", B, plan(B, 1, 9)), 0.6)
    assert rogue is not None and rogue.category == "non-planner"
    lying = v.accept(feed("plan", B, plan(A, 1, 9)), 0.7)
    assert lying is not None and lying.category == "forged"
    assert v.plan.epoch == 2


def test_new_term_plan_replaces_older_term():
    v, feed = make_view()
    v.accept(feed("claim", A, {"term": 1}), 0.1)
    v.accept(feed("plan", A, plan(A, 1, 7)), 0.2)
    t = 0.2 + view_mod.DEAD_AFTER_S + 1
    for peer in (B, C):
        v.accept(feed("peer", peer, record()), t)
    assert v.accept(feed("claim", B, {"term": 2}), t) is None
    assert v.accept(feed("plan", B, plan(B, 2, 1, peers=(B, C))), t) is None
    assert v.plan.key == (2, 1)
    old = v.accept(feed("plan", A, plan(A, 1, 8)), t)  # a deposed planner: stale, not hostile
    assert old is not None and old.category is None
    assert v.plan.key == (2, 1)


def test_replays_are_dropped_and_penalties_block():
    v, feed = make_view()
    env = feed("telemetry", A, {"links": {}})
    assert v.accept(env, 1.0) is None
    drop = v.accept(env, 1.1)  # a second copy (gossip after sync): dropped, not blamed
    assert drop is not None and drop.category is None and "duplicate" in drop.reason
    newer, older = feed("telemetry", A, {"links": {}}), feed("telemetry", A, {"links": {}})
    newer = Envelope(newer.kind, newer.author, older.seq + 1, 0.0, newer.body)
    assert v.accept(newer, 1.15) is None
    late = v.accept(older, 1.15)  # overtaken on another gossip path: not a replay
    assert late is not None and late.category is None
    for _ in range(2):
        v.penalties.penalise(A, "malformed", 1.2)
    assert v.penalties.is_blocked(A, 1.3)
    assert not v.is_alive(A, 1.3)
    assert v.accept(feed("telemetry", A, {"links": {}}), 1.4) is not None
    assert not v.penalties.is_blocked(A, 1.3 + BLOCK_S + 1)


def test_links_take_the_pessimistic_end_and_age_out():
    v, feed = make_view()
    v.record_rtt(A, 2.0, now=10.0)
    row = {ME: {"rtt_ms": 4.0, "rtt_age_s": 0.1, "bandwidth_mbps": 800.0, "bandwidth_age_s": 1.0}}
    v.accept(feed("telemetry", A, {"links": row}), 10.5)
    links = v.links.freshest(11.0)
    link = links[(A, ME)]
    assert link.rtt_ms == 4.0  # both ends measured it: the larger round trip counts
    assert link.bandwidth_mbps == 800.0  # only A measured the rate
    assert link.age_s == pytest.approx(0.6)
    # the round trip ages out first, then the rate
    assert v.links.freshest(10.0 + links_mod.MAX_LINK_AGE_S + 5)[(A, ME)].rtt_ms is None
    assert v.links.freshest(10.0 + links_mod.MAX_RATE_AGE_S + 5) == {}


def test_a_peer_cannot_make_its_own_links_look_better_than_the_other_end_measured():
    v, feed = make_view()
    v.record_rtt(A, 50.0, now=10.0)
    v.links.record_bandwidth(A, 10.0, now=10.0)
    # A claims a perfect link to us, measured just now, in every row it sends
    row = {ME: {"rtt_ms": 0.01, "rtt_age_s": 0.0, "bandwidth_mbps": 1e6, "bandwidth_age_s": 0.0}}
    v.accept(feed("telemetry", A, {"links": row}), 11.0)
    link = v.links.freshest(11.0)[(A, ME)]
    assert (link.rtt_ms, link.bandwidth_mbps) == (50.0, 10.0)


def test_status_document_shape():
    v, feed = make_view()
    v.own_record = PeerRecord.from_dict(record())
    v.accept(feed("claim", A, {"term": 1}), 0.1)
    v.accept(feed("plan", A, plan(A, 1, 1)), 0.2)
    v.record_rtt(B, 1.5, 0.3)
    status = swarm_status(v, 0.5).to_dict()
    assert SwarmStatus.from_dict(status).to_dict() == status  # what `status --json` prints
    assert set(status) >= {"run", "planner", "peers", "links", "plan"}
    assert [p["id"] for p in status["peers"]] == [A, B, C, ME]
    assert all({"id", "alive", "planner", "role"} <= set(p) for p in status["peers"])
    assert [p["planner"] for p in status["peers"]] == [True, False, False, False]
    assert status["links"] == [
        {
            "a": B,
            "b": ME,
            "rtt_ms": 1.5,
            "bandwidth_mbps": None,
            "age_s": 0.2,
            "connection": "direct",
        }
    ]
    assert set(status["plan"]) == {
        "term",
        "epoch",
        "planner",
        "stages",
        "pipelines",
        "spares",
        "cost_s",
        "stage_layers",
        "reason",
        "previous_cost_s",
        "predicted_step_s",
    }


def test_a_plan_the_run_cannot_take_is_refused_and_blamed():
    """Attack 3: a plan of more stages than the model has layers was accepted, and every worker
    in it exited."""
    v, feed = make_view(me=C, peers=(A, B))
    v.run = RunSpec().replace(stages=2, n_layer=2)
    assert v.accept(feed("claim", A, {"term": 1}), 0.1) is None
    bad = {**plan(A, 1, 1), "stages": 3, "pipelines": [[A, B, C]]}
    drop = v.accept(feed("plan", A, bad), 0.2)
    assert drop is not None and drop.category == "malformed" and v.plan is None
    assert v.accept(feed("plan", A, plan(A, 1, 2)), 0.3) is None and v.plan is not None


def test_a_plan_whose_stage_layers_miss_the_run_s_layers_is_refused_and_blamed():
    v, feed = make_view(me=C, peers=(A, B))
    v.run = RunSpec().replace(stages=2, n_layer=4)
    assert v.accept(feed("claim", A, {"term": 1}), 0.1) is None
    two_stages = {**plan(A, 1, 1), "stages": 2, "pipelines": [[A, B]]}
    drop = v.accept(feed("plan", A, {**two_stages, "stage_layers": [2, 3]}), 0.2)
    assert drop is not None and drop.category == "malformed" and v.plan is None
    assert v.accept(feed("plan", A, {**two_stages, "stage_layers": [3, 1]}), 0.3) is None
    assert v.plan is not None and v.plan.layer_ranges(4) == [range(0, 3), range(3, 4)]


def test_a_plan_naming_a_stranger_waits_for_its_record():
    v, feed = make_view(me=C, peers=(A, B))
    assert v.accept(feed("claim", A, {"term": 1}), 0.1) is None
    drop = v.accept(feed("plan", A, plan(A, 1, 1, peers=(A, "Zzzz"))), 0.2)
    assert drop is not None and drop.category is None and v.plan is None  # not blamed
    assert v.accept(feed("peer", "Zzzz", record()), 0.3) is None
    assert v.accept(feed("plan", A, plan(A, 1, 1, peers=(A, "Zzzz"))), 0.4) is None
    assert v.plan is not None and v.plan.peers() == {A, "Zzzz"}


def test_a_flood_of_throwaway_identities_leaves_nothing_behind():
    """Attack 8: per-author tables were never pruned; identities are free."""
    v, feed = make_view(me=C, peers=(A, B))
    for i in range(500):
        stranger = f"Sybil{i}"
        v.accept(feed("claim", stranger, {"term": 1}), 1.0)  # no record: dropped, seq noted
        v.penalties.penalise(stranger, "malformed", 1.0)
    assert len(v.penalties) == 500
    v.forget_stale(2.0)
    assert v.seqs.authors() <= {A, B, C}
    v.forget_stale(1.0 + 10 * BLOCK_S)  # scores decayed, blocks over
    assert len(v.penalties) == 0
    assert v.accept(feed("peer", A, record()), 601.0) is None  # (A was silent, so forgotten)
    assert v.accept(feed("claim", A, {"term": 1}), 601.5) is None  # members still work


def test_only_holders_of_the_organisers_planner_token_may_claim():
    """Attack 3: `planner_capable` was self-declared, so a fresh identity claiming a huge term
    won every view."""
    v, feed = make_view(me=C, peers=(A,))
    no_token = {**record(), "token": None}
    assert v.accept(feed("peer", "Evil", no_token), 0.0) is None  # an open run admits it...
    drop = v.accept(feed("claim", "Evil", {"term": 2**50}), 0.1)
    assert (
        drop is not None and drop.category == "unauthorised" and v.planner is None
    )  # ...not to plan
    forged = issue_token(
        bytes(32), "Evil2", True, 2e9
    )  # signed by a key that is not the organiser's
    assert v.accept(feed("peer", "Evil2", {**record(), "token": forged.encode()}), 0.2) is None
    drop = v.accept(feed("claim", "Evil2", {"term": 5}), 0.3)
    assert drop is not None and drop.category == "unauthorised"
    assert v.accept(feed("claim", A, {"term": 1}), 0.4) is None and v.planner == A
    not_planner = {**record(), "token": issue_token(ORGANISER, "Vol", False, 2e9).encode()}
    assert v.accept(feed("peer", "Vol", not_planner), 0.5) is None
    assert v.accept(feed("claim", "Vol", {"term": 3}), 0.6).category == "unauthorised"
    assert v.planner == A
    # and a node without a planner token never claims itself
    w, _ = make_view(me=A, peers=(B,))
    w.authority.own_token = None
    assert not should_claim(w, 100.0)


def test_a_planner_token_holder_cannot_jump_the_term():
    """Issue 11, attack 3b follow-up: a planner-token holder claiming term 2**50 won every view."""
    v, feed = make_view(me=C, peers=(A, B), anchor=4)
    drop = v.accept(feed("claim", B, {"term": 2**50}), 0.1)
    assert drop is not None and drop.category == "unauthorised" and v.planner is None
    assert v.known_term() == 4  # (the category costs B a penalty in Intake)
    bound = 4 + view_mod.MAX_TERM_STEP
    assert v.accept(feed("claim", A, {"term": bound}), 0.2) is None and v.planner == A
    # a plan cannot carry the term past the bound either
    drop = v.accept(feed("plan", A, plan(A, bound + view_mod.MAX_TERM_STEP + 1, 1)), 0.3)
    assert drop is not None and drop.category == "unauthorised" and v.term == bound
    # our own next claim stays within everyone's bound
    v.planner = None
    assert v.claim() == bound + 1


def test_a_fresh_node_learns_the_term_from_the_organiser_before_it_claims_or_blames():
    v, feed = make_view(me=A, peers=(B,), anchor=None)  # joined, no sync reply yet
    assert not should_claim(v, 100.0)  # a claim from behind the current term would be refused
    drop = v.accept(feed("claim", B, {"term": 9}), 0.1)  # the swarm may well be at term 9
    assert drop is not None and drop.category is None  # dropped, not blamed
    learn_term(v, B, 100)  # a member's word is no anchor
    assert not v.term_anchored
    learn_term(v, v.bootstrap_id, 8)  # the organiser's sync reply
    assert v.term_anchored
    assert v.accept(feed("claim", B, {"term": 9}), 0.2) is None and v.planner == B
    # the organiser itself, restarted, learns the term from its planner-token holder
    boot = organiser_view()
    boot.accept(feed("peer", B, record()), 0.0)
    learn_term(boot, "Stranger", 50)  # no member, no token: ignored
    assert not boot.term_anchored
    learn_term(boot, B, 9)
    assert boot.term_anchored and boot.known_term() == 9
    assert boot.accept(feed("claim", B, {"term": 10}), 0.1) is None


def test_with_token_admission_a_peer_without_a_token_is_no_member():
    v, feed = make_view(me=C, peers=(A,))
    v.run = RunSpec().replace(admission="token")
    assert v.accept(feed("peer", "Stranger", {**record(), "token": None}), 0.0) is not None
    assert "Stranger" not in v.members and A in v.members
    expired = issue_token(ORGANISER, "Late", False, 1.0).encode()
    assert v.accept(feed("peer", "Late", {**record(), "token": expired}), 0.1) is not None
    volunteer = issue_token(ORGANISER, "Vol", False, 2e9).encode()
    assert v.accept(feed("peer", "Vol", {**record(), "token": volunteer}), 0.2) is None
    assert "Vol" in v.live_members(0.3)


def test_the_organisers_revocation_drops_a_token_before_it_expires():
    """Issue 11: a token could not be revoked before it expired."""
    v, feed = make_view(me=C, peers=(A, B))
    v.run = RunSpec().replace(admission="token")
    assert v.accept(feed("claim", A, {"term": 1}), 0.1) is None and v.planner == A
    boot = v.bootstrap_id
    assert boot is not None
    forged = {"entries": [issue_revocation(bytes(32), A).to_dict()]}  # not the organiser's key
    assert v.accept(feed("revoked", boot, forged), 0.2).category == "forged"
    revoked = {"entries": [issue_revocation(ORGANISER, A).to_dict()]}
    assert v.accept(feed("revoked", B, revoked), 0.3).category == "unauthorised"  # not its say
    assert v.may_plan(A) and v.planner == A
    assert v.accept(feed("revoked", boot, revoked), 0.4) is None
    assert v.planner is None and not v.may_plan(A) and A not in v.members  # token run: out
    assert v.accept(feed("peer", A, record()), 0.5) is not None  # and stays out
    assert v.accept(feed("claim", B, {"term": 2}), 0.6) is None and v.planner == B


def test_a_busy_moment_is_not_drift_the_estimates_keep_the_best_recent_probes() -> None:
    v, _ = make_view(me=ME, peers=(A,))
    v.record_rtt(A, 20.0, now=1.0)
    v.links.record_bandwidth(A, 40.0, now=1.0)
    # training traffic queues the next probes: a longer round trip, a share of the rate
    v.record_rtt(A, 90.0, now=2.0)
    v.links.record_bandwidth(A, 8.0, now=20.0)
    sample = v.links.samples[A]
    assert (sample.rtt_ms, sample.bandwidth_mbps) == (20.0, 40.0)
    assert (sample.rtt_at, sample.bandwidth_at) == (2.0, 20.0)  # the latest probe's time
    # a link that really got worse shows it once the better probes have rolled out
    for i in range(RECENT_RTTS):
        v.record_rtt(A, 60.0 + i, now=3.0 + i)
    for i in range(RECENT_RATES):
        v.links.record_bandwidth(A, 9.0 + i, now=40.0 + i)
    assert (sample.rtt_ms, sample.bandwidth_mbps) == (60.0, 9.0 + RECENT_RATES - 1)
    # and probes older than the window do not count
    v.links.record_bandwidth(A, 1.0, now=40.0 + RECENT_RATES + RECENT_WINDOW_S)
    assert sample.bandwidth_mbps == 1.0


def test_a_late_candidate_hears_the_organisers_term_out_before_it_claims():
    """The organiser says term 4 stands: a candidate that joined a running swarm waits up to
    DEAD_AFTER_S for that term's planner before it claims (at 5 s, on a loaded machine, one
    claimed before gossip or sync brought it the incumbent's claim); a fresh swarm's term 0
    does not hold it up."""
    v, feed = make_view(me=A, peers=(B,), anchor=None)
    learn_term(v, v.bootstrap_id, 4, 1.0)
    grace = ELECTION_GRACE_S + 0.1
    assert not should_claim(v, grace)
    assert not should_claim(v, 1.0 + view_mod.DEAD_AFTER_S - 0.1)
    assert should_claim(v, 1.0 + view_mod.DEAD_AFTER_S + 0.1)  # nobody planning: claim
    w, feed = make_view(me=A, peers=(B,), anchor=None)
    learn_term(w, w.bootstrap_id, 4, 1.0)
    assert w.accept(feed("peer", B, record()), 3.0) is None
    assert w.accept(feed("claim", B, {"term": 4}), 3.0) is None and w.planner == B
    assert not should_claim(w, 1.0 + view_mod.DEAD_AFTER_S + 0.1)  # the incumbent, heard
    fresh, _ = make_view(me=A, peers=(B,), anchor=None)
    learn_term(fresh, fresh.bootstrap_id, 0, 1.0)
    assert should_claim(fresh, grace)
