"""A run outlives its swarm across machines (issue 30): in the WAN testbed, 4 `join` nodes (each
in its own namespace, its own checkpoint directory) train a 2 x 2 plan to step N and are all
SIGTERMed; two of them and a new node with an empty checkpoint directory start again on a 1 x 3
plan (another cut of the model). The new swarm adopts the first one's step-N states: the new
node fetches what it needs from the others (state transfer), every stage is re-cut from them,
and training resumes at step N."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from p2ptrain import identity
from p2ptrain.schedule.synthetic import city_topology
from tests.integration.local_runs import emulated, run_local

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,  # two emulated swarms: about 3 minutes
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
]

RUN = """
[run]
run_id = "wan-resume"
compute_aware = false
stages = {stages}
n_layer = 4
n_head = 2
n_embd = 32
block_size = 16
batch_size = 8
checkpoint_interval = 3
"""
STEPS_FIRST = 6


def _emulated(tmp_path: Path, name: str, num_peers: int, stages: int, steps: int) -> dict:
    topology = tmp_path / f"{name}.json"
    peers = city_topology(num_peers, 1, num_peers, seed=0, cities=["Virginia", "Ohio"])
    topology.write_text(json.dumps(peers.to_json()))
    run = tmp_path / f"{name}.toml"
    run.write_text(RUN.format(stages=stages))
    return run_local(*emulated(topology, steps, tmp_path / name, run), timeout_s=400)


def test_a_swarm_restarted_with_other_peers_resumes_through_state_transfer(
    tmp_path: Path,
) -> None:
    first = _emulated(tmp_path, "first", 4, stages=2, steps=STEPS_FIRST)
    assert [len(p) for p in first["plan"]["pipelines"]] == [2, 2]
    ids = {
        identity.peer_id_of(identity.load_identity(tmp_path / "first" / f"peer-{i}.key")): i
        for i in range(4)
    }
    # the nodes of the first pipeline come back (with their keys and checkpoint directories)
    # as peers 0 and 1; peer 2 is a new machine with an empty directory
    second = tmp_path / "second"
    for new, peer in enumerate(first["plan"]["pipelines"][0]):
        old = ids[peer]
        (second / f"peer-{new}").mkdir(parents=True)
        shutil.copy(tmp_path / "first" / f"peer-{old}.key", second / f"peer-{new}.key")
        shutil.copytree(
            tmp_path / "first" / f"peer-{old}" / "checkpoints",
            second / f"peer-{new}" / "checkpoints",
        )

    resumed = _emulated(tmp_path, "second", 3, stages=3, steps=STEPS_FIRST + 3)
    assert [len(p) for p in resumed["plan"]["pipelines"]] == [3]  # another cut of the model
    assert resumed["first_step"] == STEPS_FIRST and resumed["steps"] == 3
    initial, last = first["loss"][0], first["loss"][-1]
    assert abs(resumed["loss"][0] - last) < abs(resumed["loss"][0] - initial), (first, resumed)
    logs = [(second / f"peer-{i}.log").read_text() for i in range(3)]
    assert all(f"resumed from step {STEPS_FIRST} (lineage " in log for log in logs)
    assert "fetched stage-L" in logs[2]  # the new node's state came over the network
    assert not any("STAGE STATE LOST" in log for log in logs)
