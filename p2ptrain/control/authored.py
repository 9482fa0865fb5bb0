"""What this node authors: its signed messages, each built fresh from its state.

Six of them: our peer record, the run spec and the organiser's revocations (the bootstrap),
telemetry (members), and the planner's claim and plan. They stand apart from the publisher that
paces them on gossip (control/publishing.py) because other pieces hand them out too: sync serves
them, discovery puts our record and the run spec in the DHT, the run RPC answers with the spec.
"""

from __future__ import annotations

from p2ptrain import __version__
from p2ptrain.control import wire
from p2ptrain.control.planner_sight import pool_size
from p2ptrain.control.state import NodeState
from p2ptrain.records import PROTOCOL_LEVEL, Claim, PeerRecord, Telemetry
from p2ptrain.records.token import revocation_pages

# a plan's envelope over this is not gossiped: our claims name it and nodes pull it hop by hop
# (control/plan_pull.py); 1,000 peers' is ~200 kB, over gossip's 64 KiB envelope
INLINE_PLAN_BYTES = 48 * 1024


def record_message(state: NodeState) -> bytes:
    """Our signed peer record (also kept in the view, for our own line in the status)."""
    return _signed(state, own_record(state))


def own_record(state: NodeState) -> PeerRecord:
    """Our peer record as it stands (kept in the view: the status and the planner read it)."""
    record = PeerRecord(
        addrs=tuple(state.addrs),
        data_addrs=tuple(state.data_addrs),
        role=state.role,
        planner_capable=state.view.may_plan(state.peer_id),  # as our token says
        token=state.view.authority.own_token,
        version=__version__,
        protocol=PROTOCOL_LEVEL,
        hardware=state.hardware,
        compute_gflops=state.compute_gflops,
        stage_compute=state.stage_compute,
        saved=state.saved_states(),
        reachability=state.reachability,
        relay_addrs=tuple(state.relay_addrs),
        relays=tuple(state.relays),
        term=organiser_term(state),
        planned=state.role == "bootstrap" and state.view.run_planned,
    )
    state.view.own_record = record
    return record


def organiser_term(state: NodeState) -> int | None:
    """The current term, in the bootstrap's record once it knows it: what the planner-token
    holders wait on before they claim, gossiped, so they need not win a busy bootstrap's RPC."""
    view = state.view
    if state.role != "bootstrap" or not view.term_anchored:
        return None
    return view.known_term()


def _signed(state: NodeState, body: wire.Body) -> bytes:
    """`body` as our next envelope, signed for our run (once we know it)."""
    run_id = state.view.run.run_id if state.view.run is not None else ""
    return wire.encode(state.seed, state.seq.next(), body, run_id=run_id)


def run_message(state: NodeState) -> bytes:
    assert state.view.run is not None
    return _signed(state, state.view.run)


def revocation_messages(state: NodeState) -> list[bytes]:
    """The organiser's revocations as signed pages, also kept in NodeState.latest so that sync
    serves every page (paged like any held envelope) to a node that missed some."""
    pages = revocation_pages(tuple(state.view.authority.revocations.values()))
    messages = [_signed(state, page) for page in pages]
    for page, data in zip(pages, messages, strict=True):
        author = state.peer_id if page.page == 0 else f"{state.peer_id}/{page.page}"
        state.latest[(author, "revoked")] = data  # the key of intake.latest_key
    return messages


def telemetry_message(state: NodeState) -> bytes:
    view, now = state.view, state.clock()
    body = Telemetry(
        links=view.links.own_row(now),
        metrics=view.own_metrics,
        health=view.own_health,
        coordinate=view.links.estimate.published_coordinate(),
        capacity=view.links.estimate.capacity.capacity(now),
    )
    return _signed(state, body)


def claim_message(state: NodeState) -> bytes:
    """Our claim of the term, naming our plan if it is too large to gossip (plan_pull.py)."""
    plan = state.view.plan
    pulled = plan is not None and own_plan_bytes(state) > INLINE_PLAN_BYTES
    sees = pool_size(state.view, state.clock())
    return _signed(state, Claim(state.view.term, plan.key if pulled and plan else None, sees))


def own_plan_bytes(state: NodeState) -> int:
    """Our current plan's envelope size (0: the plan is not ours to publish), once a version."""
    view = state.view
    plan = view.plan
    if plan is None or plan.planner != state.peer_id or plan.term != view.term:
        return 0
    version, size = state.plan_bytes
    if version != view.plan_version:
        size = len(plan_message(state))
        state.plan_bytes = (view.plan_version, size)
    return size


def plan_message(state: NodeState) -> bytes:
    assert state.view.plan is not None
    return _signed(state, state.view.plan)


def authored_messages(state: NodeState, telemetry: bool = True) -> list[bytes]:
    """A fresh copy of everything we author now, our record first (the organiser's revocation
    pages are served from NodeState.latest: revocation_messages); our telemetry too unless
    not `telemetry` (for a node outside its audience)."""
    view = state.view
    messages = [record_message(state)]
    if state.is_member and telemetry:
        messages.append(telemetry_message(state))
    if state.role == "bootstrap" and view.run is not None:
        messages.append(run_message(state))
    if view.planner == state.peer_id:
        messages.append(claim_message(state))
        if view.plan is not None and view.plan.planner == state.peer_id:
            messages.append(plan_message(state))
    return messages
