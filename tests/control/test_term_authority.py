"""The organiser's term, token expiry and the election's back-off (control/terms.py, candidacy.py),
with a fake clock. An organiser that fell three terms behind stayed behind, and every node that
joined later followed the wrong planner; an expired token kept a member and a planner; a live
smallest-id holder that never claimed held every election up; a newcomer followed a claim older
than the term the organiser gave it."""

from __future__ import annotations

import pytest

from p2ptrain.control import authority as authority_mod
from p2ptrain.control import view as view_mod
from p2ptrain.control.candidacy import ELECTION_GRACE_S, should_claim
from p2ptrain.control.planning.plan_inputs import plannable_members
from p2ptrain.control.term_learning import learn_term
from p2ptrain.control.terms import TERM_REVOTE_EVERY_S
from p2ptrain.control.view import SwarmView
from p2ptrain.records import RunSpec, issue_token
from tests.control.test_view import ORGANISER, Feed, make_view, organiser_view, plan, record

DEAD = view_mod.DEAD_AFTER_S
GRACE = ELECTION_GRACE_S


def anchored_organiser(feed: Feed, holders: tuple[str, ...], term: int = 0) -> SwarmView:
    boot = organiser_view()
    for holder in holders:
        assert boot.accept(feed("peer", holder, record("trainer")), 0.0) is None
    for holder in holders:
        learn_term(boot, holder, term, 0.0)
    assert boot.term_anchored and boot.known_term() == term
    return boot


def test_an_organiser_cut_off_during_three_failovers_votes_again_instead_of_blaming() -> None:
    feed = Feed()
    boot = anchored_organiser(feed, ("Aaaa", "Bbbb", "Cccc", "Dddd"))
    assert boot.accept(feed("claim", "Aaaa", {"term": 1}), 0.5) is None
    # it missed terms 2 and 3: the term-4 claim passes its bound, but it may be the one behind
    drop = boot.accept(feed("claim", "Dddd", {"term": 4}), 5.0)
    assert drop is not None and drop.category is None  # no blame
    assert not boot.term_anchored  # it asks its holders again (sync_partners.py: term-only)
    for holder in ("Bbbb", "Cccc", "Dddd"):
        learn_term(boot, holder, 4, 5.5)
    assert boot.term_anchored and boot.known_term() == 4
    assert boot.accept(feed("claim", "Dddd", {"term": 4}), 6.0) is None  # followed now
    assert boot.planner == "Dddd"


def test_a_holder_blocked_at_the_organiser_cannot_keep_it_and_every_newcomer_behind() -> None:
    feed = Feed()
    hostile, honest, other = "Haaa", "Pbbb", "Qccc"
    boot = anchored_organiser(feed, (hostile, honest, other))
    member, _ = make_view(me="Mmmm", peers=(), anchor=0)
    for peer in (hostile, honest, other):
        assert member.accept(feed("peer", peer, record("trainer")), 0.0) is None
    boot.penalties.penalise(hostile, "forged", 1.0)  # one forged envelope straight to it
    for i, term in enumerate((1, 3, 5, 7)):  # gossiped to everyone else
        claim = feed("claim", hostile, {"term": term})
        assert member.accept(claim, 2.0 + i) is None
        assert boot.accept(claim, 2.0 + i) is not None  # blocked there
    assert (member.term, boot.known_term()) == (7, 0)
    t = 100.0  # the hostile holder went quiet; the honest one takes over
    for view in (member, boot):
        for peer in (honest, other):
            view.accept(feed("peer", peer, record("trainer")), t)
    claim = feed("claim", honest, {"term": 8})
    assert member.accept(claim, t) is None
    drop = boot.accept(claim, t)
    assert drop is not None and drop.category is None  # the honest planner is not blamed
    learn_term(boot, honest, 8, t + 1.0)  # the live holders' word (the hostile one is blocked)
    learn_term(boot, other, 8, t + 1.0)
    assert boot.term_anchored and boot.known_term() == 8
    newcomer, _ = make_view(me="Nnnn", peers=(honest,), now=t, anchor=boot.known_term())
    assert newcomer.accept(feed("claim", honest, {"term": 8}), t + 2.0) is None
    assert newcomer.planner == honest


def test_a_liar_cannot_raise_the_organisers_term_through_a_vote_again() -> None:
    feed = Feed()
    holders = ("Hone", "Htwo", "Hthr")
    boot = anchored_organiser(feed, holders, term=5)
    drop = boot.accept(feed("claim", "Hone", {"term": 10**6}), 1.0)
    assert drop is not None and drop.category is None and not boot.term_anchored
    learn_term(boot, "Hone", 10**6, 1.5)  # the liar answers first
    learn_term(boot, "Htwo", 5, 1.6)
    learn_term(boot, "Hthr", 5, 1.7)
    assert boot.term_anchored and boot.known_term() == 5  # the low median
    # and it cannot keep the organiser unanchored: one vote per TERM_REVOTE_EVERY_S
    assert boot.accept(feed("claim", "Hone", {"term": 10**6}), 2.0).category is None
    assert boot.term_anchored
    later = 1.0 + TERM_REVOTE_EVERY_S
    boot.accept(feed("telemetry", "Hone", {"links": {}}), later)
    boot.accept(feed("claim", "Hone", {"term": 10**6}), later)
    assert not boot.term_anchored
    # a member, which the organiser anchors, still blames a jump
    member, _ = make_view(me="Mmmm", peers=("Hone",), anchor=5)
    assert member.accept(feed("claim", "Hone", {"term": 10**6}), 1.0).category == "unauthorised"


def test_a_dead_holders_jump_starts_no_vote() -> None:
    feed = Feed()
    boot = anchored_organiser(feed, ("Hone", "Htwo", "Hthr"))
    drop = boot.accept(feed("claim", "Hone", {"term": 9}), DEAD + 5.0)  # silent since 0
    assert drop is not None and drop.category is None and boot.term_anchored


class FakeWallClock:
    """authority.py reads token expiry against time.time()."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> FakeWallClock:
    clock = FakeWallClock(1000.0)
    monkeypatch.setattr(authority_mod, "time", clock)
    return clock


def test_a_member_whose_token_expired_is_dropped(wall: FakeWallClock) -> None:
    v, feed = make_view(me="Mmmm", peers=("Aaaa",))
    v.run = RunSpec().replace(admission="token")
    for peer in ("Vone", "Vtwo"):
        token = issue_token(ORGANISER, peer, False, 1500.0).encode()
        assert v.accept(feed("peer", peer, {**record("trainer"), "token": token}), 0.0) is None
    wall.now = 2000.0  # expired: a member already admitted was never checked again
    v.accept(feed("telemetry", "Vone", {"links": {}}), 2.0)
    v.forget_stale(2.0)  # the periodic housekeeping
    assert "Vone" not in v.members and "Vone" not in plannable_members(v, 2.0)
    token = issue_token(ORGANISER, "Vtwo", False, 1500.0).encode()
    assert v.accept(feed("peer", "Vtwo", {**record("trainer"), "token": token}), 2.0) is not None
    assert "Vtwo" not in v.members  # its new record is refused: so is it
    assert "Aaaa" in v.members


def test_an_expired_planner_token_deposes_the_planner(wall: FakeWallClock) -> None:
    v, feed = make_view(me="Bbbb", peers=())
    holder = "Haaa"
    token = issue_token(ORGANISER, holder, True, 1500.0).encode()
    assert v.accept(feed("peer", holder, {**record("trainer"), "token": token}), 0.0) is None
    assert v.accept(feed("claim", holder, {"term": 1}), 1.0) is None and v.planner == holder
    assert v.accept(feed("plan", holder, plan(holder, 1, 1, peers=(holder, "Bbbb"))), 1.5) is None
    wall.now = 2000.0
    assert not v.may_plan(holder)
    drop = v.accept(feed("plan", holder, plan(holder, 1, 2, peers=(holder, "Bbbb"))), 7.0)
    assert drop is not None and drop.category is None and v.plan.key == (1, 1)
    assert should_claim(v, 7.0)  # it still lives, sends no new claim: it is no planner
    v.forget_stale(7.0)
    assert v.planner is None


def test_a_silent_smallest_holder_delays_the_election_by_rank_only() -> None:
    v, feed = make_view(me="Cccc", peers=("Aaaa", "Bbbb"))
    t = GRACE + 0.1
    for peer in ("Aaaa", "Bbbb"):
        v.accept(feed("telemetry", peer, {"links": {}}), t)  # alive, never claiming
    assert not should_claim(v, t)  # rank 2: A's turn first, then B's
    for peer in ("Aaaa", "Bbbb"):
        v.accept(feed("telemetry", peer, {"links": {}}), t + DEAD + 1.0)
    assert not should_claim(v, t + DEAD + 1.0)
    for peer in ("Aaaa", "Bbbb"):
        v.accept(feed("telemetry", peer, {"links": {}}), t + 2 * DEAD)
    assert should_claim(v, t + 2 * DEAD)
    w, feed = make_view(me="Bbbb", peers=("Aaaa",))
    assert not should_claim(w, t)
    w.accept(feed("telemetry", "Aaaa", {"links": {}}), t + DEAD)
    assert should_claim(w, t + DEAD)  # rank 1: one dead_after_s
    x, _ = make_view(me="Aaaa", peers=("Bbbb",))
    assert should_claim(x, t)  # the smallest claims as soon as it does today


def test_the_back_off_starts_when_the_planner_is_lost() -> None:
    v, feed = make_view(me="Cccc", peers=("Aaaa", "Bbbb"))
    assert v.accept(feed("claim", "Bbbb", {"term": 1}), 1.0) is None
    assert not should_claim(v, GRACE + 1.0)  # a planner stands: no clock runs
    t = 100.0  # B died long ago; A lives but never claims
    v.accept(feed("telemetry", "Aaaa", {"links": {}}), t)
    assert not should_claim(v, t)  # lost now, not at B's claim: rank 1 waits from here
    v.accept(feed("telemetry", "Aaaa", {"links": {}}), t + DEAD)
    assert should_claim(v, t + DEAD)
    assert v.claim() == 2


def test_a_newcomer_ignores_a_claim_older_than_the_organisers_term() -> None:
    v, feed = make_view(me="Nnnn", peers=("Qqqq", "Pppp"), anchor=5)
    drop = v.accept(feed("claim", "Qqqq", {"term": 2}), 1.0)  # a deposed holder's re-send
    assert drop is not None and drop.category is None and v.planner is None
    assert v.accept(feed("plan", "Qqqq", plan("Qqqq", 2, 9, peers=("Qqqq",))), 1.1) is not None
    assert v.plan is None
    assert v.accept(feed("claim", "Pppp", {"term": 5}), 1.2) is None and v.planner == "Pppp"


def test_an_old_claim_pulled_by_sync_holds_no_election_up() -> None:
    v, feed = make_view(me="0aaa", peers=("Aaaa",))
    t = 100.0  # A has been silent since 0; a sync partner serves its claim, signed at t - 20
    drop = v.accept(feed("claim", "Aaaa", {"term": 2}), t, heard_at=t - 20.0)
    assert drop is not None and drop.category is None
    assert should_claim(v, t + 0.1)  # no fresh word of a term 2 planner to hear out
    assert v.claim() == 3  # above the term it heard of


def test_a_dead_holders_claim_does_not_make_the_live_planners_look_stale() -> None:
    v, feed = make_view(me="Nnnn", peers=("Aaaa", "Pppp"), anchor=3)
    t = DEAD + 10.0
    v.accept(feed("peer", "Pppp", record()), t)
    assert v.accept(feed("claim", "Aaaa", {"term": 4}), t) is not None  # believed dead
    assert v.accept(feed("claim", "Pppp", {"term": 3}), t) is None and v.planner == "Pppp"
