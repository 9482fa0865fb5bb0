"""When the swarm is ready for its first plan.

A plan restarts every training session it changes, so the first one should be made on what the
swarm will train on: every trainer's data-plane address (a plan without it is refused by the
workers), the links among trainers (control-only members move no data), and, for a
compute-aware scheduled run, every trainer's timed stage. The planner waits for these, bounded
(control/planning/plan_maker.py); this module says what is missing. Pure.

The links: a swarm of at most FULL_MESH_PEERS (control/estimate/book.py) waits for every pair's
round trip and rate (an unmeasured link is priced at a guess, and the measurement that follows
re-plans). A bigger one never measures every pair: it waits until most of its members'
coordinates have settled (control/estimate/coordinates.py), plans on the estimates, and the
plan's own links are measured right after (control/measuring.py: plan partners first). Unless
its links are all near (one metro, a LAN, one machine): then no distance is worth the wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from p2ptrain.control.estimate.book import is_full_mesh
from p2ptrain.control.estimate.coordinates import SETTLED_ERROR, settled
from p2ptrain.control.links import Link
from p2ptrain.records import RunSpec, SavedStage, StageCompute
from p2ptrain.records.estimate import MAX_COORDINATE_ERROR, NetCoordinate


def first_plan_gaps(
    members: Sequence[str],
    roles: Mapping[str, str | None],
    data_addrs: Mapping[str, Sequence[str]],
    links: Mapping[tuple[str, str], Link],
    measured: Mapping[str, StageCompute | None],
    run: RunSpec,
    private: frozenset[str] = frozenset(),
    coordinates: Mapping[str, NetCoordinate] | None = None,
    saved: Mapping[str, tuple[SavedStage, ...] | None] | None = None,
) -> list[str]:
    """What the first plan still lacks, one short phrase each (empty: ready). Two `private`
    peers (behind NATs with no relay slot: neither can reach the other) have no link to wait
    for. `coordinates`: the members' gossiped ones (ours included), for a swarm too big to
    measure in full (without them, every link is waited for). `saved`: the run's states each
    member's record names (None: not judged): each trainer's word on them; what their holders
    lack is `holder_gaps`'s, waited for up to the run's `resume_wait_s`."""
    trainers = [p for p in members if roles.get(p) == "trainer"]
    gaps = []
    no_address = [p for p in trainers if not data_addrs.get(p)]
    if no_address:
        gaps.append(f"{len(no_address)} data-plane address(es)")
    linked: list[str] = []  # the trainers whose every link the plan waits for
    if coordinates is not None and not is_full_mesh(len(members)):
        placed = trainers or list(members)  # a control-only swarm plans every member
        errors = [
            c.error if (c := coordinates.get(p)) is not None else MAX_COORDINATE_ERROR
            for p in placed
        ]
        if not settled(errors) and not all_near(placed, links):
            num_settled = sum(e <= SETTLED_ERROR for e in errors)
            gaps.append(f"{num_settled} of {len(placed)} coordinates settled")
    else:
        linked = trainers
    pairs = [
        (a, b)
        for i, a in enumerate(linked)
        for b in linked[i + 1 :]
        if not (a in private and b in private)
    ]
    unmeasured = 0
    for a, b in pairs:
        link = links.get((min(a, b), max(a, b)))
        if link is None or link.rtt_ms is None or link.bandwidth_mbps is None:
            unmeasured += 1
    if unmeasured:
        gaps.append(f"{unmeasured} of {len(pairs)} links")
    if saved is not None and run.checkpoint.resume == "latest":
        unsaid = [peer for peer in trainers if saved.get(peer) is None]
        gaps += [f"{len(unsaid)} trainer(s)' saved states"] if unsaid else []
    if run.swarm.prices_compute:
        untimed = [
            p
            for p in trainers  # a control-only peer has no worker to time
            if (timed := measured.get(p)) is None or timed.run_id != run.run_id
        ]
        if untimed:
            gaps.append(f"{len(untimed)} timed stage(s)")
    return gaps


# a stage's newest state counts as the newest lineage's when it is at most this many checkpoint
# intervals older than that lineage's newest: a stage killed mid-interval saved an interval
# before the others, while a stage of the lineage's earlier cut, not trained since, is older
RECENT_INTERVALS = 2


def holder_gaps(
    trainers: Sequence[str], saved: Mapping[str, tuple[SavedStage, ...] | None], run: RunSpec
) -> list[str]:
    """What a restarted swarm's first plan (resume = "latest") still lacks of the run's saved
    states once every trainer said which it holds: unless one lineage's recent states (within
    RECENT_INTERVALS checkpoint intervals of the newest) hold every block, the holders of the
    blocks the newest lineage's lack: a restarted swarm adopts one lineage
    (worker/resume/adopt.py), once, so a plan made without them starts those blocks from
    initial weights, and the holder's state, once it joins, is not used. Empty for a run that
    saved none, and while a trainer has not said (first_plan_gaps waits for its word)."""
    if run.checkpoint.resume != "latest" or any(saved.get(peer) is None for peer in trainers):
        return []
    n_layer = run.model.n_layer  # a state past the model is no state of this run
    states = [s for peer in trainers for s in saved.get(peer) or () if s.end <= n_layer]
    if not states:
        return []
    newest = max(states, key=lambda state: state.step)
    interval = run.checkpoint.checkpoint_interval
    oldest = newest.step - RECENT_INTERVALS * interval if interval else 0
    # any lineage complete in its recent states will do: a new term starts a new lineage id,
    # and a stage killed before its first save under it holds only its ancestor's
    recent: dict[str, list[tuple[int, int]]] = {}
    for state in states:
        if state.step >= oldest:
            recent.setdefault(state.lineage, []).append((state.first, state.end))
    # ranges, not blocks: a record names 64 of up to 10^6
    if any(not _gaps(sorted(ranges), n_layer) for ranges in recent.values()):
        return []
    missing = _gaps(sorted(recent[newest.lineage]), n_layer)
    spans = ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in missing)
    return [f"the holder of blocks {spans} (the run's states reach step {newest.step})"]


def _gaps(covered: Sequence[tuple[int, int]], n_layer: int) -> list[tuple[int, int]]:
    """The block ranges [a, b) of [0, n_layer) that the sorted ranges `covered` leave out."""
    gaps, reached = [], 0
    for first, end in covered:
        if first > reached:
            gaps.append((reached, first))
        reached = max(reached, end)
    return gaps + ([(reached, n_layer)] if reached < n_layer else [])


# at least this many measured round trips per placed member, all near, make a LAN
NEAR_EVIDENCE_PER_MEMBER = 2
# a round trip this short is near: within one metro a delay's error is worth no wait, next to
# the activations' transfers the plan prices (and a loaded machine's probes of a 1 ms loopback
# link read up to 17 ms after the links' min-filter)
NEAR_LINK_RTT_MS = 20.0
NEAR_SHARE = 0.75  # a loaded machine's jitter outlives the links' min-filter on a few


def all_near(placed: Sequence[str], links: Mapping[tuple[str, str], Link]) -> bool:
    """Are the measured round trips among `placed` near: NEAR_LINK_RTT_MS or less (NEAR_SHARE of
    them: a loaded moment is no distance), with NEAR_EVIDENCE_PER_MEMBER of them per member?
    Then the coordinates have nothing to place, however unsettled their own error: on one
    machine a 1 ms round trip's scheduling jitter kept 32 members' coordinates from settling
    for minutes, and the first plan waited FIRST_PLAN_WAIT_S for nothing."""
    members = set(placed)
    rtts = [
        link.rtt_ms
        for (a, b), link in links.items()
        if link.rtt_ms is not None and a in members and b in members
    ]
    if len(rtts) < NEAR_EVIDENCE_PER_MEMBER * len(members):
        return False
    return sum(rtt <= NEAR_LINK_RTT_MS for rtt in rtts) >= NEAR_SHARE * len(rtts)
