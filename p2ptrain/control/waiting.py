"""What a node waits for, in words: why the swarm does not train yet, or no longer.

A node that does not train says so once, and again when the reason changes
(control/run_watch.py: its log on stderr, a line on `join`'s stdout, the bootstrap's warning); the
status document carries the same reason (`waiting`, `waiting_for`). The reasons, first that holds:
- `bootstrap`: not joined yet, or no run spec from the organiser;
- `finished`: every placed replica trained the run's last step, or is gone (control/run_end.py):
  nothing left to wait for;
- `peers`: no member alive, or fewer than the run's `min_peers` before the first plan (of a
  run not under way: no planner's plan seen, SwarmView.run_planned);
- `planner-token`: no live member holds a planner token, so no one may plan: with the command
  that issues one (for a peer not revoked; in a joiner's first TOKENS_HEARD_S, while the
  members' records are still arriving, `planner` instead);
- `planner`: the election has not settled on a live planner yet;
- `measurements`: the first plan waits for links, data-plane addresses, timed stages or, in a
  restart, the holders of the run's saved states (control/planning/readiness.py), counted;
- `plan`: the first plan is being made, or a plan that names this peer is due;
- `place`: the plan leaves this peer out as a spare;
- `version`: the live planner speaks another protocol level (records/peer.py PROTOCOL_LEVEL),
  so it never places this member (plan_inputs.plannable_members): install the run's version.
Not waiting (kind ""): this peer is placed in the plan, or (the bootstrap) the swarm trains. Pure.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from p2ptrain.control.planning.plan_inputs import first_plan_gaps_in, plannable_members
from p2ptrain.control.run_end import placed
from p2ptrain.control.view import MEMBER_ROLES, SwarmView
from p2ptrain.records import PROTOCOL_LEVEL

WAIT_KINDS = (
    "",
    "bootstrap",
    "finished",
    "peers",
    "planner-token",
    "planner",
    "measurements",
    "plan",
    "place",
    "version",
)


@dataclass(frozen=True)
class Wait:
    kind: str  # WAIT_KINDS ("": not waiting)
    text: str  # what is waited for, for people ("": not waiting)


NOT_WAITING = Wait("", "")
TOKENS_HEARD_S = 10.0  # a joiner's first seconds: the members' records are on their way


def waiting_for(view: SwarmView, now: float, joined: bool = True) -> Wait:
    """What this node waits for, as `view` sees the swarm at `now`."""
    run = view.run
    if run is None or not joined:
        return Wait("bootstrap", "the bootstrap: joining it and learning the run")
    if view.finished:
        return Wait("finished", f"nothing: run {run.run_id} is finished ({view.run_end.how})")
    member = view.role in MEMBER_ROLES
    if member and placed(view.plan, view.self_id):
        return NOT_WAITING
    if member and (level_text := other_level_text(view, now)):
        return Wait("version", level_text)
    members = plannable_members(view, now)
    if not members:
        return Wait(
            "peers", f"peers: none alive yet (the run's min_peers is {run.swarm.min_peers})"
        )
    # holders among all live members (a control-only one, or one of another level, plans too)
    planning = view.planner is not None and view.is_alive(view.planner, now)
    if not planning and not any(view.may_plan(peer) for peer in view.live_members(now)):
        if view.role != "bootstrap" and now - view.started_at < TOKENS_HEARD_S:
            # a joiner hears the members' records (their tokens) a moment after the run: it
            # told the organiser to issue a token a member held already
            return Wait("planner", "the planner election")
        return Wait("planner-token", no_planner_text(view, members))
    plan = view.plan
    if plan is None:
        under_way = view.run_planned  # a plan of the run was out (SwarmView.run_planned)
        if len(members) < run.swarm.min_peers and not under_way:
            return Wait(
                "peers", f"peers: {len(members)} of the run's min_peers {run.swarm.min_peers} alive"
            )
        if view.planner is None or not view.is_alive(view.planner, now):
            if view.may_plan(view.self_id) and not view.term_anchored:
                # no claim of ours before it (candidacy.should_claim; control/sync_partners.py)
                return Wait("planner", "the planner election (the organiser's current term)")
            return Wait("planner", "the planner election")
        if under_way:  # a newcomer to a run that trains: no "first" plan to measure for
            which = "a plan that places this peer" if member else "the planner's current plan"
            return Wait("plan", f"{which} ({view.planner} is making it)")
        if gaps := first_plan_gaps_in(view, members, now):
            text = f"the first plan's measurements: {', '.join(gaps)} still missing"
            return Wait("measurements", text)
        return Wait("plan", f"the first plan ({view.planner} is making it)")
    if not member:
        return NOT_WAITING  # the bootstrap: a plan is out, the swarm trains
    if view.self_id in plan.spares:
        num_placed = sum(len(pipeline) for pipeline in plan.pipelines)
        return Wait(
            "place",
            f"a place in the plan: plan t{plan.term}/e{plan.epoch} places {num_placed} peers "
            "and leaves this one out as a spare (it trains when a plan places it)",
        )
    metrics = view.own_metrics
    if metrics is not None and metrics.silent and metrics.silent_plan is not None:
        term, epoch = metrics.silent_plan  # our start agreement failed: were we the silent one?
        return Wait(
            "plan",
            f"a plan that names this peer: our start agreement under plan t{term}/e{epoch} "
            f"never heard {len(metrics.silent)} of its members (a member most of a plan never "
            "heard, perhaps this one, is left out of plans for 10-40 min)",
        )
    return Wait("plan", "a plan that names this peer (the planner re-plans after a join)")


def other_level_text(view: SwarmView, now: float) -> str:
    """The live planner's protocol level where it is not ours, in words; else ""."""
    planner = view.planner
    leader = None if planner is None else view.members.get(planner)
    if leader is None or leader.record.protocol in (None, PROTOCOL_LEVEL):
        return ""
    if planner is None or not view.is_alive(planner, now):
        return ""
    return (
        f"a planner of this node's protocol level {PROTOCOL_LEVEL}: the planner {planner} runs "
        f"p2ptrain {leader.record.version} at level {leader.record.protocol} and plans only "
        "members of its own; install the version the run's organiser names"
    )


def no_planner_text(view: SwarmView, members: list[str]) -> str:
    """No live member may plan: what the organiser runs to change that."""
    assert view.run is not None
    revoked = view.authority.revocations  # no token for them: "there is no un-revoke"
    candidates = [p for p in (view.self_id, *members) if p in members and p not in revoked]
    peer = candidates[0] if candidates else "PEER_ID"
    command = (
        f"p2ptrain token issue --identity BOOTSTRAP.key --peer {peer} "
        f"--run-id {shlex.quote(view.run.run_id)} --planner"
    )
    return (
        "a planner: no member holds a planner token, so no one may plan. The organiser issues "
        f"one with the bootstrap's key: `{command}`, and that peer joins with --token TOKEN "
        "(docs/operations.md)"
    )
