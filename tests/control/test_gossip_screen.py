"""Issue 26, finding 13: what gossip forwards. GossipSub (py-libp2p 0.8.1) forwards a message
only when our validator passes it, so these tests call the validator as GossipSub does: a message
the view ignores, one past its author's rate, one of another run and one from an author a token
run does not admit are all refused (not forwarded); the last without its body being parsed."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, cast

from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.control.flood import GOSSIP_LIMITS, WINDOW_S, GossipRates
from p2ptrain.control.gossip import CONTROL_TOPIC, TELEMETRY_TOPIC, validator_for
from p2ptrain.control.intake import Intake
from p2ptrain.control.publishing import Publisher
from p2ptrain.control.state import MIN_REPUBLISH_GAP_S, NodeState
from p2ptrain.control.view import SwarmView
from p2ptrain.net.ratelimit import StampWindows
from p2ptrain.records import RunSpec, issue_token

ORGANISER = os.urandom(32)
ME = os.urandom(32)
RUN_ID = "screen-test"


def record_body(token: str | None = None, role: str = "control-only") -> dict[str, Any]:
    body: dict[str, Any] = {
        "addrs": [],
        "data_addrs": [],
        "role": role,
        "planner_capable": True,
        "version": "0",
        "hardware": {},
        "compute_gflops": None,
    }
    if token is not None:
        body["token"] = token
    return body


def make_node(
    admission: str = "token",
    seed: bytes = ME,
    bootstrap_id: str = "",
    run: RunSpec | None = None,
    host: Any = None,
    joined: bool = False,
) -> tuple[NodeState, Intake]:
    """A control-only node of RUN_ID's run and ORGANISER's swarm, unless told another (a
    bootstrap and its run spec); `seed`: its identity (and its host's); `joined`: in the swarm
    already (it then serves its own messages)."""
    view = SwarmView(
        self_id=identity.peer_id_of(seed),
        role="control-only",
        planner_capable=True,
        started_at=time.monotonic(),
        bootstrap_id=bootstrap_id or identity.peer_id_of(ORGANISER),
        run=run or RunSpec().replace(run_id=RUN_ID, admission=admission),
    )
    state = NodeState(
        seed=seed,
        role="control-only",
        peer_id=view.self_id,
        host=cast(Any, host),
        view=view,
        hardware={},
    )
    if joined:
        state.joined.set()
    return state, Intake(state)


class Author:
    """A peer that publishes its own envelopes (the pubsub signer is the author)."""

    def __init__(self, token_run: str = RUN_ID) -> None:
        self.seed = os.urandom(32)
        self.id = identity.peer_id_of(self.seed)
        self.token = issue_token(ORGANISER, self.id, False, time.time() + 3600, token_run)
        self.seq = wire.SeqClock()

    def message(
        self, kind: str, body: dict[str, Any], topic: str = CONTROL_TOPIC, run_id: str = RUN_ID
    ) -> rpc_pb2.Message:
        data = wire.sign(self.seed, kind, self.seq.next(), body, run_id=run_id)
        return rpc_pb2.Message(
            from_id=ID.from_base58(self.id).to_bytes(),
            data=data,
            seqno=os.urandom(8),
            topicIDs=[topic],
        )

    def record(self, **changes: Any) -> rpc_pb2.Message:
        return self.message("peer", {**record_body(self.token.encode()), **changes})

    def telemetry(self) -> rpc_pb2.Message:
        return self.message("telemetry", {"links": {}}, TELEMETRY_TOPIC)


def validate(state: NodeState, intake: Intake, author: Author, msg: rpc_pb2.Message) -> bool:
    topic = msg.topicIDs[0]
    return validator_for(topic, state, intake)(ID.from_base58(author.id), msg)


def test_messages_the_view_ignores_are_not_forwarded() -> None:
    state, intake = make_node()
    stranger, member = Author(), Author()
    # a token run: a record without a token, and telemetry of an author with no record
    assert not validate(state, intake, stranger, stranger.message("peer", record_body()))
    assert not validate(state, intake, stranger, stranger.telemetry())
    assert stranger.id not in state.view.members
    # what the view accepts is forwarded (and a copy of it, already applied, too)
    assert validate(state, intake, member, member.record())
    assert validate(state, intake, member, member.telemetry())
    again = member.record()
    assert validate(state, intake, member, again)
    assert state.view.penalties.score(stranger.id) == 0  # ignored, not blamed


def test_the_token_is_checked_before_the_body_is_parsed() -> None:
    """A token run: a record whose author holds no valid token is dropped on its header and
    token alone, so its body (here malformed) is never parsed, nor blamed."""
    state, intake = make_node()
    stranger, other_run = Author(), Author(token_run="another-run")
    assert not validate(state, intake, stranger, stranger.message("peer", record_body(role="king")))
    assert state.view.penalties.score(stranger.id) == 0  # today: "malformed", from the body
    # a token the organiser signed for another of its runs admits nobody here
    assert not validate(state, intake, other_run, other_run.record())
    assert other_run.id not in state.view.members
    # an admitted author's malformed body is still parsed, and blamed
    member = Author()
    assert not validate(state, intake, member, member.record(role="king"))
    assert state.view.penalties.score(member.id) > 0


def test_envelopes_of_another_run_are_refused_by_gossip_and_sync() -> None:
    state, intake = make_node(admission="open")
    peer = Author()
    assert not validate(state, intake, peer, peer.message("peer", record_body(), run_id="other"))
    data = wire.sign(peer.seed, "peer", peer.seq.next(), record_body(), run_id="other")
    env = wire.decode(data)
    assert env.run_id == "other"
    assert not intake.apply(env, data, peer.id, "sync", time.monotonic())
    assert peer.id not in state.view.members
    # an envelope of ours, or one of an older peer (no run), is taken
    assert validate(state, intake, peer, peer.message("peer", record_body(), run_id=RUN_ID))
    assert validate(state, intake, peer, peer.message("peer", record_body(), run_id=""))


def test_an_author_past_its_rate_is_refused_blamed_and_blocked(caplog: Any) -> None:
    state, intake = make_node()
    member = Author()
    assert validate(state, intake, member, member.record())
    limit = GOSSIP_LIMITS["telemetry"]
    results = [validate(state, intake, member, member.telemetry()) for _ in range(limit + 20)]
    assert all(results[:limit]) and not any(results[limit + 2 :])
    assert state.view.penalties.is_blocked(member.id, time.monotonic())
    assert "dropped flooding message" in caplog.text


def test_honest_publishing_never_meets_the_rates() -> None:
    """publishing.py's schedule at its fastest (intervals jittered down to 0.9x) plus changes
    announced at once, for ten minutes: never refused."""
    intervals_s = {"peer": 6.0, "telemetry": 2.0, "claim": 2.0, "plan": 4.0, "run": 10.0}
    for kind, interval_s in intervals_s.items():
        rates = GossipRates()
        now, allowed = 0.0, True
        for _ in range(4):  # four changes in a row, each published at the next tick
            allowed &= rates.allow("honest", kind, now)
            now += 0.2
        while now < 600.0:
            allowed &= rates.allow("honest", kind, now)
            now += 0.9 * interval_s
        assert allowed, kind
    pages = GossipRates()  # the organiser's revocation pages: up to 8 per 10 s round
    assert all(
        pages.allow("boot", "revoked", r * 10.0 + i * 0.02) for r in range(60) for i in range(8)
    )


def test_stamp_windows_count_by_stamp_whatever_the_order_and_forget_the_idle_first() -> None:
    windows = StampWindows(limit=3, window_s=10.0, max_keys=2)
    # three stamps, newest first: the order of arrival does not matter
    assert all(windows.allow("a", 20.0, t) for t in (19.0, 15.0, 12.0))
    assert not windows.allow("a", 20.0, 18.0)  # a fourth within the window
    assert not windows.allow("a", 20.0, 9.0)  # stamped before the window: stale
    assert windows.allow("a", 22.5, 22.5)  # 12.0 has left the window
    windows.allow("b", 23.0)
    windows.allow("c", 23.0)  # a third key: "a", idle longest, is forgotten
    assert len(windows) == 2 and windows.num_refused == 2


def test_an_honest_backlog_delivered_at_once_is_no_flood() -> None:
    """A receiver (or a forwarder) stalled for 25 s on a busy machine gets an author's telemetry
    of those 25 s together: paced by the signed timestamps, every message passes."""
    rates = GossipRates()
    assert rates.allow("honest", "telemetry", 1000.0, 1000.0)
    backlog = [1000.0 + 2.0 * i for i in range(1, 13)]  # 12 messages, one every 2 s
    assert all(rates.allow("honest", "telemetry", 1025.0, signed) for signed in backlog)
    # and a node meeting the author for the first time in such a backlog (it was itself stalled)
    first_contact = GossipRates()
    assert all(first_contact.allow("honest", "telemetry", 1025.0, t) for t in [1000.0, *backlog])


def test_stamps_ahead_of_our_clock_or_behind_it_earn_a_flooder_nothing() -> None:
    limit = GOSSIP_LIMITS["telemetry"]
    ahead, behind = GossipRates(), GossipRates()
    # stamped up to 30 s ahead (the skew the decoder allows): counted as now
    passed = sum(ahead.allow("flooder", "telemetry", 0.0, 0.1 * i) for i in range(300))
    assert passed == limit
    # stamped behind our clock, over the whole age the decoder lets through: one window's worth
    passed = sum(behind.allow("flooder", "telemetry", 100.0, 70.0 + 0.05 * i) for i in range(600))
    assert passed == limit
    # flooding on for another minute: the limit per window, nothing more
    passed = sum(
        behind.allow("flooder", "telemetry", 100.0 + 0.01 * i, 100.0 + 0.01 * i)
        for i in range(6000)
    )
    assert passed <= limit * (60.0 / WINDOW_S + 1)


def test_a_flapping_state_is_republished_at_most_once_a_second() -> None:
    """publish_soon after each of many changes (an election flapping under load) still leaves a
    second between two messages of a kind: far inside the rate others hold us to."""
    state, _ = make_node()
    publisher = Publisher(state, cast(Any, None))
    sent = []
    now = 100.0
    while now < 160.0:
        state.publish_soon("claim")  # the state changes at every election tick
        if publisher._due_now("claim", 2.0, now):
            sent.append(now)
        now += 0.2
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert sent and min(gaps) >= MIN_REPUBLISH_GAP_S - 1e-9
    rates = GossipRates()  # a receiver of those claims never drops one
    assert all(rates.allow(state.peer_id + "x", "claim", t, t) for t in sent)
