"""Every record: the dict a producer writes survives a round trip, and bad values are refused
with the one wire error."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from p2ptrain import identity
from p2ptrain.errors import UserError, WireError
from p2ptrain.records import (
    Claim,
    Health,
    Hello,
    LinkFacts,
    MetricsReport,
    PeerRecord,
    Plan,
    PlanMessage,
    RunSpec,
    Stop,
    SwarmStatus,
    Telemetry,
    Token,
    issue_token,
    message_from_dict,
    token_problem,
)
from p2ptrain.records.peer import LEFT_REASON, QUIT_REASON
from tests.records.samples import (
    SAMPLES,
    A,
    B,
    C,
    metrics_dict,
    peer_dict,
    plan_dict,
    status_dict,
)


@pytest.mark.parametrize("kind,data", SAMPLES, ids=lambda x: getattr(x, "__name__", ""))
def test_round_trip(kind: Any, data: dict[str, Any]) -> None:
    record = kind.from_dict(copy.deepcopy(data))
    assert record.to_dict() == data
    assert kind.from_dict(record.to_dict()) == record


def test_a_wire_error_is_a_user_error_with_a_category() -> None:
    with pytest.raises(WireError) as caught:
        Plan.from_dict({"term": 1})
    assert isinstance(caught.value, UserError)
    assert caught.value.category == "malformed"


def _plan_with(**changes: Any) -> dict[str, Any]:
    return {**plan_dict(), **changes}


@pytest.mark.parametrize(
    "changes",
    [
        {"pipelines": []},  # nobody trains
        {"stages": 3},  # pipelines of 2
        {"stages": 0},
        {"pipelines": [[A, A]]},
        {"spares": [A]},  # a pipeline member is no spare
        {"term": -1},
        {"term": 10**400},  # would overflow any float conversion
        {"epoch": True},  # a bool is no integer
        {"cost_s": math.nan},
        {"cost_s": math.inf},
        {"planner": "not a peer id!"},
        {"data_addrs": {A: "not a list"}},
        {"data_addrs": {A: [""]}},
        {"data_addrs": {A: ["/ip4/1.2.3.4/tcp/1"] * 17}},
        {"network": {"max_rtt_s": -1, "min_rate_mbps": 1}},
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 0}},
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 1, "groups": [[0.1, 1]]}},  # 2 stages
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 1, "groups": [[0.1, 1], [0.1]]}},
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 1, "groups": [[0.1, 0], [0.1, 1]]}},
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 1, "hops": [[[601, 1]]]}},
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 1, "hops": [[[0.1, 1]], [[0.1, 1]]]}},
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 1, "hops": [[]]}},  # a hop missing
        {"network": {"max_rtt_s": 0.1, "min_rate_mbps": 1, "hops": "all fast"}},
        {"pipelines": [[A, B]] * 2000},
        {"stage_layers": [4]},  # one count for 2 stages
        {"stage_layers": [3, 0]},  # a stage without blocks
        {"stage_layers": [2, True]},
        {"stage_layers": [2, 1.5]},
        {"stage_layers": "3,1"},
        {"stage_layers": [1, 10**7]},
        {"donors": [B]},  # placed at a stage: a donor is one of the spares
        {"donors": "C"},
        {"donors": [C, C]},
        {"donors": [C], "donor_blocks": {B: [0, 2]}},  # blocks of a peer that is no donor
        {"donors": [C], "donor_blocks": {C: [2, 2]}},
        {"donors": [C], "donor_blocks": {C: [2]}},
        {"donors": [C], "donor_blocks": {C: [-1, 2]}},
        {"donors": [C], "donor_blocks": {C: "L2-4"}},
    ],
)
def test_bad_plans_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(WireError):
        Plan.from_dict(_plan_with(**changes))


def test_a_plan_knows_each_peers_role() -> None:
    plan = Plan.from_dict(
        _plan_with(pipelines=[[A, B], [C, "w3"]], spares=[], data_addrs={}, network=None)
    )
    role = plan.role_of(B)
    assert role is not None and role.is_last and role.prev_peer == A and role.next_peer is None
    assert role.stage_peers == (B, "w3") and role.num_replicas == 2
    assert plan.role_of("elsewhere") is None
    assert plan.peers() == {A, B, C, "w3"} and plan.key == (2, 5)
    moved = plan.replace(pipelines=((B, A), (C, "w3")))
    assert not plan.same_placement(moved) and plan.same_placement(plan.replace(epoch=6))


def test_a_plan_cuts_the_model_by_its_stage_layers_or_evenly() -> None:
    uneven = Plan.from_dict(plan_dict())  # stage_layers [3, 1]
    assert uneven.layer_ranges(4) == [range(0, 3), range(3, 4)]
    assert uneven.layer_problem(4) is None and "sum" in str(uneven.layer_problem(5))
    with pytest.raises(ValueError):
        uneven.layer_ranges(5)
    even = Plan.from_dict({k: v for k, v in plan_dict().items() if k != "stage_layers"})
    assert even.stage_layers == () and "stage_layers" not in even.to_dict()
    assert even.layer_ranges(5) == [range(0, 3), range(3, 5)]  # the model's own cut
    assert "2 stages" in str(even.layer_problem(1))
    # another split is another placement: the sessions must restart on the new layers
    assert not uneven.same_placement(even) and uneven.same_placement(uneven.replace(epoch=9))
    with pytest.raises(ValueError):
        uneven.replace(stage_layers=(4,))


@pytest.mark.parametrize(
    "kind,data",
    [
        (PeerRecord, {**peer_dict(), "addrs": ["garbage"] * 17}),
        (PeerRecord, {**peer_dict(), "role": "king"}),
        (PeerRecord, {**peer_dict(), "planner_capable": 1}),
        (PeerRecord, {**peer_dict(), "hardware": {"deep": [[[[[[1]]]]]]}}),
        (PeerRecord, {**peer_dict(), "compute_gflops": 10**400}),
        (Telemetry, {"links": {A: {"rtt_ms": -3}}}),
        (Telemetry, {"links": {"bad id!": {}}}),
        (Telemetry, {"links": {}, "metrics": {"loss": "low"}}),
        (Claim, {"term": 0}),
        (Claim, {"term": 2**60}),
        (Hello, {"peer_id": A, "data_addrs": [], "pid": -1}),
        (MetricsReport, {**metrics_dict(), "averaging": "maybe"}),
        (MetricsReport, {**metrics_dict(), "loss": math.nan}),
        (MetricsReport, {**metrics_dict(), "bytes_sent": -1}),
        (MetricsReport, {**metrics_dict(), "link_bytes": {A: {"sent": 1}}}),
        (MetricsReport, {**metrics_dict(), "link_bytes": {"bad id!": {"sent": 1, "received": 1}}}),
        (MetricsReport, {**metrics_dict(), "link_bytes": {f"p{i}": {} for i in range(1025)}}),
        (Telemetry, {"links": {}, "metrics": {"bytes_received": 1.5}}),
        (RunSpec, {"steps": 10**400}),
        (RunSpec, {"lr": math.inf}),
        (RunSpec, {"stages": "two"}),
        (Stop, ["stop"]),
    ],
)
def test_bad_records_are_refused(kind: Any, data: Any) -> None:
    with pytest.raises(WireError):
        kind.from_dict(data)


def test_unknown_fields_are_ignored_on_the_wire_but_not_in_a_run_spec() -> None:
    """A newer peer may add fields to what it gossips; a run spec field nobody knows is a typo."""
    assert Claim.from_dict({"term": 2, "later": "field"}) == Claim(2)
    with pytest.raises(WireError, match="unknown run spec field"):
        RunSpec.from_dict({"stepz": 3})


def test_reports_and_telemetry_of_older_peers_have_no_byte_counters() -> None:
    timings = ("forward_s", "backward_s", "update_s", "averaging_s")
    old_fields = ("bytes_sent", "bytes_received", "link_bytes", "group_size", *timings)
    old = MetricsReport.from_dict({k: v for k, v in metrics_dict().items() if k not in old_fields})
    assert (old.bytes_sent, old.bytes_received, old.link_bytes, old.group_size) == (0, 0, {}, None)
    assert all(getattr(old, name) is None for name in timings)
    metrics = Telemetry.from_dict({"links": {}, "metrics": {"step": 3}}).metrics
    assert metrics is not None and metrics.bytes_sent is None and metrics.bytes_received is None


def test_messages_dispatch_on_their_type() -> None:
    assert message_from_dict({"type": "stop"}) == Stop()
    message = message_from_dict({"type": "plan", "plan": plan_dict(), "run": None})
    assert isinstance(message, PlanMessage) and message.run is None
    assert isinstance(message_from_dict(metrics_dict()), MetricsReport)
    for bad in ({"type": "throughput"}, {"kind": "stop"}, [], {"type": 3}):
        with pytest.raises(WireError):
            message_from_dict(bad)


@pytest.mark.parametrize(
    "addr",
    [
        f"/ip4/127.0.0.1/tcp/4001/p2p/{A}",
        "/ip4/10.77.0.3/tcp/0",
        "/ip6/::1/tcp/4001",
        "/dns4/bootstrap.example.org/tcp/4001",
        "/ip4/1.2.3.4/udp/4001/quic-v1",
        f"/ip4/1.2.3.4/tcp/4001/p2p/{A}/p2p-circuit/p2p/{B}",
    ],
)
def test_dialable_addresses_pass(addr: str) -> None:
    assert PeerRecord.from_dict({**peer_dict(), "addrs": [addr]}).addrs == (addr,)


@pytest.mark.parametrize(
    "addr",
    [
        "garbage",
        "/ip4",
        "/ip4/256.1.1.1/tcp/1",
        "/ip4/1.2.3.4/tcp/70000",
        "/ip4/1.2.3.4/tcp/1/p2p/0OIl",
        "/unix/tmp/sock",
        "//",
        "/ip4//tcp/1",
        "/dns4/-/tcp/1",
    ],
)
def test_a_garbage_address_is_refused_before_anyone_dials_it(addr: str) -> None:
    """Attack 2: a peer record or plan with a garbage address spread and crashed every node
    that dialled it; now the record carrying it is refused."""
    with pytest.raises(WireError):
        PeerRecord.from_dict({**peer_dict(), "addrs": [addr]})
    with pytest.raises(WireError):
        Plan.from_dict(_plan_with(data_addrs={A: [addr]}))


def test_a_token_admits_its_peer_only_while_valid_and_only_from_the_organiser() -> None:
    organiser = bytes(range(32))
    issuer = identity.peer_id_of(organiser)
    token = issue_token(organiser, A, True, 1000.0)
    assert Token.decode(token.encode()) == token
    assert token_problem(token, issuer, A, now=999.0) is None
    assert "expired" in (token_problem(token, issuer, A, now=1001.0) or "")
    assert "not to" in (token_problem(token, issuer, B, now=0.0) or "")
    assert "organiser" in (token_problem(token, B, A, now=0.0) or "")
    flipped = Token(token.peer, False, token.expires_at, token.issuer, token.sig)
    assert "signature" in (token_problem(flipped, issuer, A, now=0.0) or "")
    for bad in ("p2pt1.!!!", "p2pt1.e30", "nope", 42, "p2pt1." + "A" * 2000):
        with pytest.raises(WireError):
            Token.decode(bad)


def test_a_plan_s_network_facts_per_group_and_hop() -> None:
    plan = Plan.from_dict(
        _plan_with(
            pipelines=[[A, B], [C, "w3"]],
            spares=[],
            data_addrs={},
            network={
                "max_rtt_s": 0.3,
                "min_rate_mbps": 10.0,
                "groups": [[0.01, 900.0], [0.2, 20.0]],
                "hops": [[[0.05, 100.0]], [[0.3, 10.0]]],
            },
        )
    )
    assert Plan.from_dict(plan.to_dict()) == plan
    network = plan.network
    assert network is not None
    assert network.group(1) == LinkFacts(0.2, 20.0) and network.hop(1, 0) == LinkFacts(0.3, 10.0)
    assert network.group(5) == network.hop(0, 3) == LinkFacts(0.3, 10.0)  # the swarm-wide pair
    assert plan.link_facts(A, C) == LinkFacts(0.01, 900.0)  # stage 0's group
    assert plan.link_facts(C, "w3") == LinkFacts(0.3, 10.0)  # replica 1's hop
    assert plan.link_facts(A, B) == LinkFacts(0.05, 100.0)
    assert plan.link_facts(A, "w3") == network.swarm  # neither: the swarm-wide pair
    assert plan.replace(network=None).link_facts(A, B) is None
    # an older planner's record: the swarm-wide pair for everything
    old = Plan.from_dict(_plan_with(network={"max_rtt_s": 0.3, "min_rate_mbps": 10.0}))
    assert old.network is not None and old.network.group(0) == LinkFacts(0.3, 10.0)
    assert "groups" not in old.to_dict()["network"]


@pytest.mark.parametrize(
    "plan",
    [
        {"stages": 3},  # pipelines of 2
        {"pipelines": [[A, B], [A, C]]},  # a peer twice
        {"spares": [A]},  # placed and spare
        {"donors": [A]},  # not a spare
        {"donors": [C, C]},
    ],
)
def test_status_refuses_a_plan_summary_no_plan_could_have(plan: dict[str, Any]) -> None:
    status = status_dict()
    with pytest.raises(WireError):
        SwarmStatus.from_dict({**status, "plan": {**status["plan"], **plan}})
    assert SwarmStatus.from_dict(status).plan is not None


def test_only_the_word_after_a_hand_over_names_a_plan() -> None:
    left = {"ok": False, "reason": LEFT_REASON, "plan": [1, 2]}
    assert Health.from_dict(left).left
    for word in (
        {"ok": True, "plan": [0, 0]},
        {"ok": False, "reason": QUIT_REASON, "plan": [1, 2]},
    ):
        with pytest.raises(WireError):
            Health.from_dict(word)


def test_a_status_says_the_runs_steps_when_it_knows_them() -> None:
    """The dashboard bounds a trainer's word of its step by them (web/history.py)."""
    status = SwarmStatus.from_dict({**status_dict(), "run_steps": 1000})
    assert status.run_steps == 1000 and status.to_dict()["run_steps"] == 1000
    assert SwarmStatus.from_dict(status_dict()).run_steps is None  # an older node's
    with pytest.raises(WireError):
        SwarmStatus.from_dict({**status_dict(), "run_steps": 0})
