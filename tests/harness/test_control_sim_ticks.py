"""The simulator's periodic per-peer work (harness/control_sim.py): a live peer's next tick is
scheduled within its jitter, a peer that left schedules nothing more."""

from __future__ import annotations

from p2ptrain.harness.control_sim import Simulation


def test_a_peer_ticks_again_while_alive_and_never_after_it_left() -> None:
    sim = Simulation(num_peers=6, seed=1)
    peer = sim.peers[-1]
    ticked: list[float] = []

    def tick(p: object) -> None:
        ticked.append(sim.now)

    queued = len(sim._queue)
    assert sim._again(peer, tick, 10.0, jitter=0.2)
    when, _, action = max(sim._queue, key=lambda event: event[1])  # the newest event
    assert len(sim._queue) == queued + 1 and sim.now + 8.0 <= when <= sim.now + 12.0
    action()
    assert ticked == [sim.now]
    assert sim._again(peer, tick, 4.0)  # no jitter: exactly the interval
    assert max(sim._queue, key=lambda event: event[1])[0] == sim.now + 4.0
    sim.remove_peer(peer)
    assert not sim._again(peer, tick, 4.0)
    assert len(sim._queue) == queued + 2
