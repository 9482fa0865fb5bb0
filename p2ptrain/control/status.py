"""The status document (`p2ptrain status --json`): the swarm as one peer's SwarmView sees it.

Its JSON fields and values are a contract relied on outside this project: keep them as they are.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from p2ptrain.control.estimate.book import is_full_mesh, plan_links
from p2ptrain.control.view import MEMBER_ROLES, Member, SwarmView
from p2ptrain.control.waiting import waiting_for
from p2ptrain.net.paging import page_of
from p2ptrain.records import (
    LinkStatus,
    PeerMetrics,
    PeerStatus,
    Plan,
    PlanSummary,
    SwarmStatus,
)
from p2ptrain.records.status import MAX_STATUS_LINKS, MAX_STATUS_PEERS

# how long one built document answers the status RPC: anyone may ask, page after page, and a
# document of a large swarm costs a walk of the whole view (seconds, in the trio loop, at 50k
# links), so a build serves for at least BUILD_SHARE times what it took
STATUS_CACHE_S = 1.0
BUILD_SHARE = 5.0
# the links nobody measured are shown as estimated up to this many members (a square of them)
MAX_ESTIMATED_STATUS_PEERS = 256


def _shown(
    peer: str, metrics: PeerMetrics | None, plan: Plan | None, plan_peers: set[str]
) -> PeerMetrics | None:
    """A peer's metrics as the status shows them: the members its start agreement never heard
    only from a peer of the current plan, under it (up to 64 ids from each of 10,000 peers
    would pass the readers' 64 MiB)."""
    if not (metrics and metrics.silent) or (
        plan is not None and metrics.silent_plan == plan.key and peer in plan_peers
    ):
        return metrics
    return dataclasses.replace(metrics, silent=(), silent_plan=None)


def swarm_status(view: SwarmView, now: float, relay_bytes: int = 0) -> SwarmStatus:
    """The `p2ptrain status --json` document, as this peer sees the swarm."""
    members = {p: m for p, m in view.members.items() if m.record.role in MEMBER_ROLES}
    if view.own_record is not None and view.role in MEMBER_ROLES:
        members[view.self_id] = Member(view.own_record, now, view.own_metrics, view.own_health)
    planner = view.planner if view.planner and view.is_alive(view.planner, now) else None
    plan_peers = set() if view.plan is None else view.plan.peers()
    peers = tuple(
        PeerStatus(
            id=peer,
            alive=view.is_alive(peer, now),
            planner=peer == planner,
            role=member.record.role,
            addrs=member.record.addrs,
            data_addrs=member.record.data_addrs,
            version=member.record.version,
            hardware=member.record.hardware,
            compute_gflops=member.record.compute_gflops,
            last_seen_s=round(now - member.last_heard, 3),
            penalty=round(view.penalties.score(peer), 2),
            metrics=_shown(peer, member.metrics, view.plan, plan_peers),
            health=member.health,
            stage_compute=member.record.stage_compute,
            reachability=member.record.reachability,
            relays=member.record.relays,
            protocol=member.record.protocol,
        )
        for peer, member in sorted(members.items())
    )
    links = tuple(
        LinkStatus(
            a=a,
            b=b,
            rtt_ms=None if link.rtt_ms is None else round(link.rtt_ms, 3),
            bandwidth_mbps=None if link.bandwidth_mbps is None else round(link.bandwidth_mbps, 1),
            age_s=round(link.age_s, 3),
            connection=view.links.connection(a, b),
        )
        for (a, b), link in sorted(view.links.freshest(now).items())
        if a in members and b in members
    )
    links += estimated_links(view, sorted(members), {(x.a, x.b) for x in links}, now)
    peers, peers_left_out = _within_cap(view, peers)
    links, links_left_out = _links_within_cap(view, {p.id for p in peers}, links)
    summary = None if view.plan is None else PlanSummary.of(view.plan)
    wait = waiting_for(view, now)
    kept = {p.id for p in peers}
    return SwarmStatus(
        run=view.run.run_id if view.run else "",
        planner=planner,
        peers=peers,
        links=links,
        plan=summary,
        observed_by=view.self_id,
        # whose telemetry this peer holds, and how old it is: gossip reach at a glance
        telemetry_age_s={
            author: round(now - received_at, 3)
            for author, (_, received_at) in view.links.rows.items()
            if author in kept
        },
        bootstrap=view.bootstrap_id,
        term=view.term,
        relay_bytes=relay_bytes,
        waiting=wait.kind,
        waiting_for=wait.text,
        finished=view.finished,
        peers_left_out=peers_left_out,
        links_left_out=links_left_out,
        run_steps=view.run.optim.steps if view.run else None,
    )


def _within_cap(
    view: SwarmView, peers: tuple[PeerStatus, ...]
) -> tuple[tuple[PeerStatus, ...], int]:
    """At most MAX_STATUS_PEERS peers, and how many were left out: the plan's, the planner and
    ourselves always, then those heard from last (a reader refuses a larger document: a flood
    of identities made every node's status unreadable)."""
    if len(peers) <= MAX_STATUS_PEERS:
        return peers, 0
    named = set() if view.plan is None else set(view.plan.peers())
    first = {view.self_id, view.planner, *named}
    ranked = sorted(peers, key=lambda p: (p.id not in first, p.last_seen_s, p.id))
    kept = tuple(sorted(ranked[:MAX_STATUS_PEERS], key=lambda p: p.id))
    return kept, len(peers) - len(kept)


def _links_within_cap(
    view: SwarmView, kept: set[str], links: tuple[LinkStatus, ...]
) -> tuple[tuple[LinkStatus, ...], int]:
    """The links between kept peers, at most MAX_STATUS_LINKS: the plan's first, then measured
    before estimated, the freshest first; and how many were left out."""
    among = tuple(link for link in links if link.a in kept and link.b in kept)
    if len(among) <= MAX_STATUS_LINKS:
        return among, len(links) - len(among)
    plan_pairs = set() if view.plan is None else plan_links(view.plan.pipelines)
    ranked = sorted(among, key=lambda x: ((x.a, x.b) not in plan_pairs, x.estimated, x.age_s))
    chosen = tuple(sorted(ranked[:MAX_STATUS_LINKS], key=lambda x: (x.a, x.b)))
    return chosen, len(links) - len(chosen)


def estimated_links(
    view: SwarmView, members: list[str], measured: set[tuple[str, str]], now: float
) -> tuple[LinkStatus, ...]:
    """The pairs nobody measured, as the planner estimates them (control/estimate/matrix.py),
    in a swarm too big to measure in full (a smaller one measures every link); their age: that
    of the older of the two ends' coordinates."""
    if is_full_mesh(len(members)) or len(members) > MAX_ESTIMATED_STATUS_PEERS:
        return ()
    # numpy and the planner's modules load when a status first needs estimates: a member that
    # never serves one holds neither (control/hardware.py)
    from p2ptrain.control.estimate.matrix import estimated_rates, estimated_rtts

    coords = view.links.estimate.coordinates_of(view.self_id, now)
    placed = [p for p in members if p in coords]
    rtts = estimated_rtts(placed, coords)
    rates = estimated_rates(placed, view.links.estimate.capacities_of(view.self_id, now))
    heard = {p: at for p, (_, at) in view.links.estimate.coordinates.items()}
    estimated = []
    for i, a in enumerate(placed):
        for j in range(i + 1, len(placed)):
            b, rate = placed[j], float(rates[i, j])
            if (a, b) in measured:
                continue
            estimated.append(
                LinkStatus(
                    a=a,
                    b=b,
                    rtt_ms=round(float(rtts[i, j]), 3),
                    bandwidth_mbps=None if math.isnan(rate) else round(rate, 1),
                    age_s=round(max(now - heard.get(a, now), now - heard.get(b, now), 0.0), 3),
                    estimated=True,
                )
            )
    return tuple(estimated)


class StatusPages:
    """The status document as the status RPC pages it (net/paging.py): page 0 holds its scalar
    fields and the first peers and links, each later page more of them. Built at most once per
    `cache_s` (or BUILD_SHARE times what the build took, counted from its end) and paged from
    that copy, so a page costs its own bytes."""

    def __init__(
        self,
        build: Callable[[float], SwarmStatus],
        page_bytes: int,
        cache_s: float = STATUS_CACHE_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._build = build
        self.page_bytes = page_bytes
        self.cache_s = cache_s
        self._clock = clock or time.monotonic
        self._fresh_until = -math.inf
        self._scalars: dict[str, Any] = {}
        self._items: list[tuple[str, Any]] = []

    def page(self, cursor: int) -> dict[str, Any]:
        started = self._clock()
        if started >= self._fresh_until:
            doc = self._build(started).to_dict()
            self._items = [("peers", p) for p in doc.pop("peers")]
            self._items += [("links", x) for x in doc.pop("links")]
            self._scalars = doc
            built = self._clock()
            self._fresh_until = built + max(self.cache_s, BUILD_SHARE * (built - started))
        page, nxt = page_of(self._items, cursor, self.page_bytes)
        reply = dict(self._scalars) if cursor == 0 else {}
        reply["peers"] = [item for section, item in page if section == "peers"]
        reply["links"] = [item for section, item in page if section == "links"]
        reply["next"] = nxt
        return reply
