"""What counts as a plan pulled (control/plan_pull.py): only a plan of at least the key a claim
named, that the view took. An older plan, or one the view refuses, fails that source, and the
pull goes on to the next (the planner); a plan is remembered as a delta base under its own key."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from p2ptrain.control.plan_pull import PlanPull
from tests.control.test_plan_pull import Planner, node_following

SENDER = "12D3KooWGzh7AaB1RcaR3aD7ZRKvk8YpbhUnHEeuEYZiGKmMYDy4"


def pulled_from(
    monkeypatch: pytest.MonkeyPatch, planner: Planner, sender_answer: bytes, key: tuple[int, int]
) -> tuple[PlanPull, Any, list[str]]:
    """Pull `key` for a node following `planner`: the claim's sender answers `sender_answer`,
    the planner its plan `key`. The puller, the node, and whom it asked in turn."""
    node = node_following(planner)
    puller = PlanPull(node[0], lambda: b"", node[1].apply)
    good = planner.plan(*key)
    asked: list[str] = []

    async def call(host: Any, peer: Any, protocol: Any, request: bytes = b"") -> Any:
        asked.append(peer.to_base58())
        answer = good if peer.to_base58() == planner.id else sender_answer
        return {"envelope": answer.decode()}

    monkeypatch.setattr("p2ptrain.control.plan_pull.rpc.call", call)
    trio.run(puller._pull, key, SENDER)
    return puller, node, asked


def test_an_older_plan_than_the_claim_named_fails_the_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner = Planner()
    older = planner.plan(1, 1)
    puller, node, asked = pulled_from(monkeypatch, planner, older, (1, 2))
    assert asked == [SENDER, planner.id]  # the sender's old plan did not end the pull
    assert node[0].view.plan is not None and node[0].view.plan.key == (1, 2)
    assert set(puller._bodies) == {(1, 2)}  # remembered under the key it holds


def test_a_plan_the_view_refuses_fails_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    planner, other = Planner(), Planner()
    not_followed = other.plan(1, 5)  # signed by a planner the node does not follow
    puller, node, asked = pulled_from(monkeypatch, planner, not_followed, (1, 1))
    assert asked == [SENDER, planner.id]
    assert node[0].view.plan is not None and node[0].view.plan.planner == planner.id
    assert set(puller._bodies) == {(1, 1)}
    assert node[0].view.penalties.score(other.id) == 0  # served by another: blames nobody
