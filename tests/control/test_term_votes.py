"""A restarted organiser learns the current term from its planner-token holders: the low median
of as many answers as it asks for at once, not the first (control/term_votes.py). A hostile
holder answering first set any term the bootstrap believed and handed to fresh nodes."""

from __future__ import annotations

from p2ptrain.control.term_learning import learn_term
from p2ptrain.control.term_votes import MAX_TERM_ASKS, TERM_VOTE_WAIT_S, TermVotes
from p2ptrain.control.view import SwarmView
from tests.control.test_view import Feed, organiser_view, record


def restarted_organiser(holders: tuple[str, ...]) -> SwarmView:
    boot = organiser_view()
    feed = Feed()  # its records hold planner tokens
    for holder in holders:
        assert boot.accept(feed("peer", holder, record()), 0.0) is None
    return boot


def test_one_liar_among_three_holders_sets_no_term() -> None:
    boot = restarted_organiser(("Hone", "Htwo", "Hthr", "Hfou"))
    learn_term(boot, "Hone", 10**6, 1.0)  # the liar answers first
    learn_term(boot, "Htwo", 7, 1.1)
    assert not boot.term_anchored  # two of the three asked have answered
    learn_term(boot, "Hthr", 7, 1.2)
    assert boot.term_anchored and boot.known_term() == 7


def test_a_liar_claiming_a_lower_term_sets_none_either() -> None:
    boot = restarted_organiser(("Hone", "Htwo", "Hthr"))
    for holder, term in (("Hone", 0), ("Htwo", 7), ("Hthr", 8)):
        learn_term(boot, holder, term, 1.0)
    assert boot.known_term() == 7


def test_a_lone_holder_is_taken_at_its_word_at_once() -> None:
    boot = restarted_organiser(("Hone",))
    learn_term(boot, "Hone", 4, 1.0)
    assert boot.term_anchored and boot.known_term() == 4


def test_holders_that_never_answer_are_waited_for_a_bounded_time() -> None:
    votes = TermVotes()
    assert votes.vote("Hone", 5, 10.0, live_holders=MAX_TERM_ASKS) is None
    assert votes.vote("Hone", 6, 10.0 + TERM_VOTE_WAIT_S / 2, live_holders=MAX_TERM_ASKS) is None
    # the others asked are dead: past the wait the answers so far decide (a holder's latest)
    assert votes.vote("Hone", 6, 10.0 + TERM_VOTE_WAIT_S, live_holders=MAX_TERM_ASKS) == 6
    two = TermVotes()
    two.vote("Hone", 9, 0.0, live_holders=2)
    assert two.vote("Htwo", 3, 0.1, live_holders=2) == 3  # the low median of two: the lower
