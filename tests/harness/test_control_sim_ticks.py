"""The simulator's periodic per-peer work (harness/control_sim.py): a live peer's next tick is
scheduled within its jitter, a peer that left schedules nothing more."""

from __future__ import annotations

import json

from p2ptrain.control.gossip import MESH_DEGREE
from p2ptrain.harness.control_sim import Simulation
from p2ptrain.harness.control_sim_cadences import plan_changes, wire_bytes


def test_a_peer_ticks_again_while_alive_and_never_after_it_left() -> None:
    sim = Simulation(num_peers=6, seed=1)
    peer = sim.peers[-1]
    ticked: list[float] = []

    def tick(p: object) -> None:
        ticked.append(sim.now)

    queued = len(sim._queue)
    assert sim.again(peer, tick, 10.0, jitter=0.2)
    when, _, action = max(sim._queue, key=lambda event: event[1])  # the newest event
    assert len(sim._queue) == queued + 1 and sim.now + 8.0 <= when <= sim.now + 12.0
    action()
    assert ticked == [sim.now]
    assert sim.again(peer, tick, 4.0)  # no jitter: exactly the interval
    assert max(sim._queue, key=lambda event: event[1])[0] == sim.now + 4.0
    sim.remove_peer(peer)
    assert not sim.again(peer, tick, 4.0)
    assert len(sim._queue) == queued + 2


def test_the_simulation_charges_the_live_cadences() -> None:
    """Re-stated records, the organiser's run spec and sync are charged, at the live pace."""
    sim = Simulation(40, seed=3)
    sim.run_until(130.0)
    kinds = sim.counters.bytes_by_kind
    assert {"record", "run", "sync", "telemetry", "probe"} <= set(kinds)
    # 40 members re-state their records every 120 s: each peer relays ~40 of them
    records = sorted(kinds["record"].values())
    per_flood = 2 * (MESH_DEGREE - 1) * sim.sizes["peer"]
    assert 20 * per_flood < records[len(records) // 2] < 60 * per_flood
    # 13 organiser floods in 130 s (every RUN_INTERVAL_S before a plan)
    run = (sim.sizes["run"] + sim.sizes["peer"]) * 2 * (MESH_DEGREE - 1)
    assert min(kinds["run"].values()) == 14 * run


def test_a_repair_is_charged_as_its_changes_at_real_id_lengths() -> None:
    """A plan's bytes count every simulated id at a real peer id's 52 characters, and a repair
    pulled against the last plan (control/plan_delta.py) moves what changed only."""
    ids = [f"sim{i:06d}" for i in range(400)]
    old = {
        "term": 1,
        "epoch": 1,
        "pipelines": [ids[i : i + 8] for i in range(0, 392, 8)],
        "spares": ids[392:],
        "data_addrs": {p: [f"/ip4/203.0.113.9/tcp/4002/p2p/{p}"] for p in ids},
    }
    repaired = [list(pipe) for pipe in old["pipelines"]]
    repaired[5][3] = ids[392]
    new = {**old, "epoch": 2, "pipelines": repaired, "spares": ids[393:]}
    whole = wire_bytes(new)
    assert whole > len(json.dumps(new, separators=(",", ":"))) + 400 * 3 * 40
    assert wire_bytes(plan_changes(old, new)) < whole / 3
