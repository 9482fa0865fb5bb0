"""The simulator's periodic per-peer work (harness/control_sim.py): a live peer's next tick is
scheduled within its jitter, a peer that left schedules nothing more."""

from __future__ import annotations

from p2ptrain.control.gossip import MESH_DEGREE
from p2ptrain.harness.control_sim import Simulation


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
