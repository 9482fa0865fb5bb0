"""What a plan is made of, as one node's view holds it: the members a plan may place
(`plannable_members`), each member's role, timed stage, data-plane addresses and reachability as
its record announces them (ours from our own), the planning child's PlanInputs gathered from
them, and what the first plan still lacks (control/planning/readiness.py) as a node that does
not plan sees it. Read by the planner (plan_maker.py), by what a node says it waits for
(waiting.py), and by whoever asks who could be placed (handover.py, planner_sight.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from p2ptrain.control.links import Link
from p2ptrain.control.planning.numbers import PlanInputs
from p2ptrain.control.planning.readiness import first_plan_gaps, holder_gaps
from p2ptrain.control.view import SwarmView
from p2ptrain.records import PeerRecord, RunSpec, SavedStage, StageCompute


def roles_of(view: SwarmView, members: list[str]) -> dict[str, str | None]:
    """Each member's role as its record announces it (ours: our own)."""
    roles = {p: view.members[p].record.role if p in view.members else None for p in members}
    if view.self_id in roles:
        roles[view.self_id] = view.role
    return roles


def plannable_members(view: SwarmView, now: float) -> list[str]:
    """Live members of our protocol level whose workers are healthy, one back after leaving
    only past its back-off (control/flapping.py). Once any trains, only trainers: a
    control-only member has no data-plane address, and a plan placing one stalls all."""
    members = view.members
    ours = [p for p in view.live_members(now) if view.is_healthy(p) and members.speaks_ours(p)]
    trainers = [p for p in ours if _role_of(view, p) == "trainer"]
    return view.flapping.admit(trainers or ours, now, members, view.plan)


def _role_of(view: SwarmView, peer: str) -> str | None:
    return view.role if peer == view.self_id else view.members.role_of(peer)


def _records(view: SwarmView, members: list[str]) -> dict[str, PeerRecord]:
    """Each member's record (ours: our own, once made)."""
    records = {peer: view.members[peer].record for peer in members if peer in view.members}
    if view.own_record is not None:
        records[view.self_id] = view.own_record
    return records


def stage_computes(view: SwarmView, members: list[str]) -> dict[str, StageCompute | None]:
    """Each member's timed stage as its record announces it (ours from our own record)."""
    return {peer: record.stage_compute for peer, record in _records(view, members).items()}


def saved_states(view: SwarmView, members: list[str]) -> dict[str, tuple[SavedStage, ...] | None]:
    """The run's saved states each member's record names (None: its worker has not said)."""
    return {peer: record.saved for peer, record in _records(view, members).items()}


def data_addrs_of(
    view: SwarmView, members: list[str], own_data_addrs: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """Each member's data-plane addresses as its record announces them (ours: own_data_addrs)."""
    return {
        peer: view.members[peer].record.data_addrs
        if peer in view.members
        else tuple(own_data_addrs)
        for peer in members
    }


def unroutable(
    view: SwarmView, members: list[str], own_reachability: str, own_relays: tuple[str, ...]
) -> frozenset[str]:
    """Peers behind a NAT that hold no relay slot: no other NATed peer can reach them (two
    NATed peers connect if either holds a slot: control/traversal.py)."""
    found = set()
    for peer in members:
        member = view.members.get(peer)
        reachability, relays = (
            (member.record.reachability, member.record.relays)
            if member is not None
            else (own_reachability, own_relays)
        )
        if reachability == "private" and not relays:
            found.add(peer)
    return frozenset(found)


def plan_inputs_of(
    view: SwarmView,
    now: float,
    members: list[str],
    links: dict[tuple[str, str], Link],
    measured: dict[str, StageCompute | None],
    private: frozenset[str],
    slowdown: Mapping[str, float],
    run: RunSpec,
) -> PlanInputs:
    """What the planning child prices and searches on (numbers.py): the members' measured
    `links` and our estimates for the rest, the links that go through a relay, the `private`
    members no one can reach, each member's timed stage and its trust `slowdown` (trust.py)."""
    relayed = frozenset(pair for pair in links if view.links.connection(*pair) == "relayed")
    return PlanInputs(
        members=tuple(members),
        links=links,
        coords=view.links.estimate.coordinates_of(view.self_id, now),
        capacities=view.links.estimate.capacities_of(view.self_id, now),
        private=private,
        relayed=relayed,
        measured=measured,
        slowdown=dict(slowdown),  # a copy: the trust's factors move on while the child works
        run=run,
    )


def first_plan_gaps_in(view: SwarmView, members: list[str], now: float) -> list[str]:
    """What the first plan still lacks (control/planning/readiness.py) as `view` sees it, our own part
    from our announced record: what a node that does not plan says it waits for (the holders of
    saved states included; the planner's bounds are its own: first_wait.py)."""
    assert view.run is not None
    own = view.own_record
    own_addrs, reachability, relays = (
        ((), "unknown", ()) if own is None else (own.data_addrs, own.reachability, own.relays)
    )
    roles, saved = roles_of(view, members), saved_states(view, members)
    trainers = [peer for peer in members if roles.get(peer) == "trainer"]
    return first_plan_gaps(
        members,
        roles,
        data_addrs_of(view, members, own_addrs),
        view.links.freshest(now),
        stage_computes(view, members),
        view.run,
        unroutable(view, members, reachability, relays),
        view.links.estimate.coordinates_of(view.self_id, now),
        saved,
    ) + holder_gaps(trainers, saved, view.run)
