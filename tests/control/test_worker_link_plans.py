"""What our worker is told to dial (control/worker_link.py): each peer's data addresses as its
own signed record declares them, whatever the planner's copy says."""

from __future__ import annotations

from typing import Any, cast

from p2ptrain.control.state import NodeState
from p2ptrain.control.worker_link import declared_data_addrs
from p2ptrain.records import Plan
from tests.control.test_view import ME, A, B, Feed, make_view, plan, record

OWN = "/ip4/127.0.0.1/tcp/4100"
DECLARED_A = "/ip4/127.0.0.1/tcp/4101"
DECLARED_B = "/ip4/127.0.0.1/tcp/4102"


def node_with_records() -> NodeState:
    view, feed = make_view(peers=(A, B))
    later = Feed()
    later.seq = feed.seq
    for peer, addr in ((A, DECLARED_A), (B, DECLARED_B)):
        body = {**record("trainer"), "data_addrs": [addr]}
        assert view.accept(later("peer", peer, body), 0.0) is None
    return NodeState(bytes(range(1, 33)), "trainer", ME, cast(Any, None), view, {})


def a_plan(data_addrs: dict[str, list[str]]) -> Plan:
    return Plan.from_dict({**plan(A, 1, 1, peers=(A, B, ME)), "data_addrs": data_addrs})


def test_addresses_no_record_declares_are_cut_and_ours_kept() -> None:
    state = node_with_records()
    planned = a_plan(
        {
            A: [DECLARED_A, "/ip4/8.8.8.8/tcp/53"],  # a third party, named by the planner
            B: ["/ip4/127.0.0.1/tcp/9"],
            ME: [OWN],
        }
    )
    handed = declared_data_addrs(planned, state)
    assert dict(handed.data_addrs) == {A: (DECLARED_A,), B: (), ME: (OWN,)}
    assert handed.key == planned.key and handed.pipelines == planned.pipelines


def test_a_plan_of_declared_addresses_is_handed_as_it_is() -> None:
    state = node_with_records()
    planned = a_plan({A: [DECLARED_A], B: [DECLARED_B], ME: [OWN]})
    assert declared_data_addrs(planned, state) is planned
