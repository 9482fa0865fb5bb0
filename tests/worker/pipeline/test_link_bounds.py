"""The data plane's waits follow the links the plan states: pipeline frames their hop, dials and
state transfers the link to the peer (worker/pipeline/link_bounds.py, pipeline.py, state_transfer.py)."""

from __future__ import annotations

from p2ptrain.records import LinkFacts, NetworkFacts, Plan, RunSpec
from p2ptrain.worker.pipeline.frames import MAX_PAYLOAD_BYTES
from p2ptrain.worker.pipeline.link_bounds import (
    CONNECT_WINDOW_S,
    DIAL_ROUND_TRIPS,
    MAX_FRAME_WAIT_S,
    MAX_LINK_RTT_S,
    MIN_LINK_RATE_MBPS,
    RECEIVE_TIMEOUT_S,
    SEND_TIMEOUT_S,
    dial_window_s,
    frame_waits_s,
)
from p2ptrain.worker.pipeline.stage_step import hop_waits_s
from p2ptrain.worker.resume.state_transfer import transfer_deadline_s

FAST = LinkFacts(0.002, 1000.0)
SLOW = LinkFacts(2.0, 0.5)  # 2 s round trips at 0.5 Mbit/s
NETWORK = NetworkFacts(
    max_rtt_s=2.0,
    min_rate_mbps=0.5,
    groups=(FAST, SLOW, FAST),
    hops=((FAST, SLOW), (SLOW, FAST)),
)
PLAN = Plan(
    term=1,
    epoch=1,
    planner="a0",
    stages=3,
    pipelines=(("a0", "a1", "a2"), ("b0", "b1", "b2")),
    spares=(),
    data_addrs={},
    cost_s=1.0,
    network=NETWORK,
)


def test_local_links_keep_the_local_bounds() -> None:
    assert frame_waits_s(None, 10**6) == (RECEIVE_TIMEOUT_S, SEND_TIMEOUT_S)
    assert frame_waits_s(FAST, 10**6) == (RECEIVE_TIMEOUT_S, SEND_TIMEOUT_S)
    assert dial_window_s(None) == dial_window_s(FAST) == CONNECT_WINDOW_S


def test_a_slow_hop_stretches_its_frames_and_dials() -> None:
    frame_bytes = 4 * 10**6  # 32 s at 1 Mbit/s: SLOW's 0.5 is taken at the floor rate
    receive_s, send_s = frame_waits_s(SLOW, frame_bytes)
    assert send_s >= 4 * 2.0 + 2 * frame_bytes * 8 / (MIN_LINK_RATE_MBPS * 1e6) > SEND_TIMEOUT_S
    assert receive_s >= 2 * send_s > RECEIVE_TIMEOUT_S
    assert dial_window_s(LinkFacts(3.0, 10.0)) > CONNECT_WINDOW_S


def test_absurd_link_facts_are_clamped() -> None:
    """A member's report can make a link 1e-6 Mbit/s with 600 s round trips (records allow
    them): frame waits of 1,000+ hours and dial windows of 6.7 h, a dead neighbour never lost."""
    absurd = LinkFacts(600.0, 1e-6)
    largest = frame_waits_s(absurd, MAX_PAYLOAD_BYTES)
    assert max(largest) <= MAX_FRAME_WAIT_S
    # the clamps are those of the worst honest link, not lower
    floor = LinkFacts(MAX_LINK_RTT_S, MIN_LINK_RATE_MBPS)
    assert largest == frame_waits_s(floor, MAX_PAYLOAD_BYTES)
    assert frame_waits_s(absurd, 10**6) == frame_waits_s(floor, 10**6)
    assert dial_window_s(absurd) == DIAL_ROUND_TRIPS * MAX_LINK_RTT_S == dial_window_s(floor)


def test_each_neighbour_s_frames_wait_for_the_hop_between_us() -> None:
    spec = RunSpec().replace(stages=3, n_layer=3, batch_size=2048, block_size=64, n_embd=128)
    role = PLAN.role_of("a1")  # replica 0, stage 1: FAST before, SLOW after
    assert role is not None
    waits = hop_waits_s(spec, role, NETWORK)
    assert set(waits) == {"a0", "a2"}
    assert waits["a0"] == (RECEIVE_TIMEOUT_S, SEND_TIMEOUT_S)
    assert waits["a2"][0] > RECEIVE_TIMEOUT_S and waits["a2"][1] > SEND_TIMEOUT_S
    other = PLAN.role_of("b1")  # replica 1: SLOW before, FAST after
    assert other is not None
    assert hop_waits_s(spec, other, NETWORK)["b0"] == waits["a2"]
    assert hop_waits_s(spec, role, None) == {p: (RECEIVE_TIMEOUT_S, SEND_TIMEOUT_S) for p in waits}


def test_a_state_transfer_is_timed_for_the_link_to_its_holder() -> None:
    size = 10**8
    group_mate = PLAN.link_facts("a0", "b0")  # stage 0's group: FAST
    assert group_mate == FAST
    assert transfer_deadline_s(size, group_mate) < transfer_deadline_s(size, NETWORK)
    assert transfer_deadline_s(size, PLAN.link_facts("a1", "b1")) == transfer_deadline_s(
        size, NETWORK
    )  # stage 1's group is the slowest link of the plan
