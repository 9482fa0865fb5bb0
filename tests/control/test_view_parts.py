"""The view is composed of parts that own their state (issue 27): each part works alone, through
its own small interface, and the view inherits behaviour from none of them."""

from __future__ import annotations

import dataclasses
import time

from p2ptrain import identity
from p2ptrain.control.authority import Authority
from p2ptrain.control.links import MAX_LINK_AGE_S, LinkTable
from p2ptrain.control.membership import DEAD_AFTER_S, FORGET_DEAD_AFTER_S, Member, Membership
from p2ptrain.control.replay import SeqGuard
from p2ptrain.control.view import SwarmView
from p2ptrain.control.wire import Envelope
from p2ptrain.records import PeerRecord, Revocation, RunSpec, Token, issue_revocation, issue_token
from tests.control.test_view import ME, ORGANISER, A, B, make_view, planner_token

BOOT = identity.peer_id_of(ORGANISER)


def member_record(planner: str | None = None) -> PeerRecord:
    token = None if planner is None else planner_token(planner)
    return PeerRecord((), "control-only", True, "0", {}, token=token)


def test_the_view_inherits_from_no_part_and_each_part_is_its_own_object() -> None:
    assert SwarmView.__bases__ == (object,)
    v, _ = make_view()
    parts = (v.authority, v.members, v.links, v.seqs)
    assert [type(part) for part in parts] == [Authority, Membership, LinkTable, SeqGuard]
    assert v.run is v.authority.run and v.bootstrap_id == v.authority.bootstrap_id == BOOT
    v.run = RunSpec().replace(admission="token")  # the view's run is the authority's
    assert v.authority.run is v.run


def test_authority_alone_answers_tokens_admission_and_revocations() -> None:
    auth = Authority(ME, True, BOOT, RunSpec().replace(admission="token"), planner_token(ME))
    assert auth.may_plan(ME, None) and not auth.may_plan(A, None)
    assert auth.may_plan(A, member_record(A)) and auth.admits(A, member_record(A))
    assert not auth.admits(B, member_record())  # a token run: no token, no member
    forged = dataclasses.replace(issue_revocation(ORGANISER, B), sig="00" * 64)
    assert auth.revoke((issue_revocation(ORGANISER, A), forged)) is not None
    assert auth.revocations == {}  # a list with a forged entry applies none
    assert auth.revoke((issue_revocation(ORGANISER, A),)) is None
    assert not auth.may_plan(A, member_record(A)) and not auth.admits(A, member_record(A))
    auth.forget_tokens(set())
    assert not auth.may_plan(A, member_record(A))  # still revoked, only the cache went


def test_a_checked_signature_vouches_for_its_own_token_only() -> None:
    """A volunteer's real token, seen once, must not make the same signature beside
    `planner=true`, a far expiry or another run id pass: the cache keys on the whole token."""
    auth = Authority(ME, True, BOOT, RunSpec().replace(admission="token"), None)
    volunteer = issue_token(ORGANISER, A, False, time.time() + 60, run_id=auth.run.run_id)
    assert auth.admits(A, member_record_with(volunteer)) and not auth.may_plan(
        A, member_record_with(volunteer)
    )
    for altered in (
        dataclasses.replace(volunteer, planner=True),
        dataclasses.replace(volunteer, expires_at=1e11),
        dataclasses.replace(volunteer, planner=True, expires_at=1e11, run_id=""),
    ):
        assert not auth.may_plan(A, member_record_with(altered))
        assert not auth.admits(A, member_record_with(altered))
    expired = issue_token(ORGANISER, B, True, time.time() - 1)
    assert not auth.may_plan(B, member_record_with(expired))
    assert not auth.may_plan(B, member_record_with(dataclasses.replace(expired, expires_at=1e11)))


def member_record_with(token: Token) -> PeerRecord:
    return PeerRecord((), "control-only", True, "0", {}, token=token)


def test_membership_alone_keeps_liveness_and_forgets_the_long_dead() -> None:
    members = Membership()
    members[A] = Member(member_record(), last_heard=0.0)
    members[B] = Member(member_record(A), last_heard=0.0)
    assert members.heard_lately(A, DEAD_AFTER_S) and not members.heard_lately(A, DEAD_AFTER_S + 1)
    members.heard_from(A, 5.0)
    members.heard_from(A, 1.0)  # an older proof changes nothing
    assert members[A].last_heard == 5.0
    assert members.forget_dead(FORGET_DEAD_AFTER_S + 1.0) == [B] and list(members) == [A]
    members.keep_only(lambda peer, record: record.token is not None)
    assert len(members) == 0


def test_link_table_alone_measures_gossips_and_forgets() -> None:
    links = LinkTable(ME)
    links.record_rtt(A, 20.0, now=1.0)
    links.record_bandwidth(A, 50.0, now=1.0)
    assert links.freshest(2.0)[(A, ME)].rtt_ms == 20.0
    assert links.own_row(2.0)[A].bandwidth_mbps == 50.0
    assert links.freshest(1.0 + MAX_LINK_AGE_S + 1.0)[(A, ME)].rtt_ms is None  # aged out
    links.forget(A)
    assert links.freshest(2.0) == {} and links.own_row(2.0) == {}


def test_seq_guard_alone_tells_repeats_reorderings_and_pages() -> None:
    seqs = SeqGuard()

    def env(kind: str, seq: int) -> Envelope:
        return Envelope(kind=kind, author=A, seq=seq, ts=0.0, body=RunSpec())

    seqs.note(env("run", 5))
    assert seqs.check(env("run", 5)) is not None and seqs.check(env("run", 4)) is not None
    assert seqs.check(env("run", 6)) is None and seqs.knows(env("run", 4))
    seqs.note(env("revoked", 5))  # pages: an older one holds other entries
    assert seqs.check(env("revoked", 4)) is None and not seqs.knows(env("revoked", 4))
    seqs.forget_authors({B})
    assert seqs.authors() == set() and not seqs.knows(env("run", 5))


def test_a_revocation_through_the_view_deposes_the_planner_and_drops_the_member() -> None:
    v, feed = make_view()
    v.run = RunSpec().replace(admission="token")
    assert v.accept(feed("claim", A, {"term": 1}), 0.2) is None and v.planner == A
    assert v.revoke((issue_revocation(ORGANISER, A),)) is None
    assert v.planner is None and A not in v.members and B in v.members
    assert isinstance(v.authority.revocations[A], Revocation)
