"""`planner-token` (no member may plan) is said only when it is so: the bootstrap and spares said
it, and told the organiser to issue a token, while a control-only holder planned for trainers
without tokens (the check looked at the plannable members only, which leave control-only ones
out once any trains, and members of another protocol level)."""

from __future__ import annotations

from p2ptrain.control.candidacy import ELECTION_GRACE_S
from p2ptrain.control.term_learning import learn_term
from p2ptrain.control.waiting import waiting_for
from p2ptrain.records import PROTOCOL_LEVEL, RunSpec
from tests.control.test_view import A, B, C, Feed, organiser_view, record


def test_a_live_control_only_planner_is_no_missing_token() -> None:
    v, feed = organiser_view(), Feed()
    v.run = RunSpec()
    learn_term(v, v.bootstrap_id, 0)
    assert v.accept(feed("peer", A, record("control-only")), 0.0) is None  # holds a token
    for trainer in (B, C):
        assert v.accept(feed("peer", trainer, {**record("trainer"), "token": None}), 0.0) is None
    assert v.accept(feed("claim", A, {"term": 1}), 1.0) is None
    assert v.planner == A
    assert waiting_for(v, ELECTION_GRACE_S).kind != "planner-token"


def test_a_holder_of_another_level_is_a_holder_all_the_same() -> None:
    v, feed = organiser_view(), Feed()
    v.run = RunSpec()
    learn_term(v, v.bootstrap_id, 0)
    newer = {**record("trainer"), "protocol": PROTOCOL_LEVEL + 1}
    assert v.accept(feed("peer", A, newer), 0.0) is None  # holds a token, of another level
    assert v.accept(feed("peer", B, {**record("trainer"), "token": None}), 0.0) is None
    assert waiting_for(v, ELECTION_GRACE_S).kind != "planner-token"


def test_no_holder_at_all_is_a_missing_token() -> None:
    v, feed = organiser_view(), Feed()
    v.run = RunSpec()
    learn_term(v, v.bootstrap_id, 0)
    assert v.accept(feed("peer", B, {**record("trainer"), "token": None}), 0.0) is None
    assert waiting_for(v, ELECTION_GRACE_S).kind == "planner-token"
