"""`p2ptrain local --emulate`: bootstrap and `join` nodes inside the WAN testbed, each in its own
namespace as on machines of their own; the control plane measures the emulated links and plans
on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain.schedule.synthetic import city_topology
from p2ptrain.testbed.netns import list_netns
from tests.integration.local_runs import emulated, start_local, summary_of, wait_local

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the testbed needs root (namespaces, TUN)"),
]


def test_join_nodes_on_their_own_addresses_behind_nats_train_with_every_round_averaged(
    tmp_path: Path,
) -> None:
    """The acceptance test of `join` across machines, volunteers behind home routers among
    them: a bootstrap and 4 `join` nodes, each in its own namespace with its own address (as on
    4 machines), started with the documented flags only (their listen addresses the defaults:
    every interface, fixed ports); peers 1 and 2 behind cone NATs, peer 3 behind a symmetric
    one, no port forwarded, so in a 2 x 2 plan NATed peers must exchange data. Each reserves
    relay slots at the public peers; the two cone peers punch a hole to each other (TCP
    simultaneous open through the relay's signalling), the symmetric one is relayed; all four
    train with every averaging round of the plan that trained each step averaged. (One swarm
    for both: a swarm's start is most of CI's time.)"""
    steps = 8
    topology = city_topology(4, 2, 2, seed=0, cities=["Virginia", "Ohio"]).to_json()
    topology["nat"] = {"1": "cone", "2": "cone", "3": "symmetric"}
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topology))
    workdir = tmp_path / "swarm"
    # 2 x 2 with every round averaged is what this test is about: timing noise on a loaded box
    # must not shrink the plan (compute-aware shapes: tests/schedule/test_compute_cost.py)
    run = tmp_path / "run.toml"
    run.write_text("[run]\ncompute_aware = false\n")
    before = set(list_netns())
    proc = start_local(*emulated(path, steps, workdir, run))
    out, err = wait_local(proc, timeout_s=300)
    assert set(list_netns()) <= before  # the testbed is gone
    summary = summary_of(proc, out, err)
    assert summary["steps"] == steps and len(summary["loss"]) == steps
    assert summary["loss"][-1] < summary["loss"][0]
    pipelines = summary["plan"]["pipelines"]
    assert len(pipelines) == 2 and all(len(p) == 2 for p in pipelines)
    assert len({p for pipe in pipelines for p in pipe}) == 4

    # each node announced its namespace's address on join's default ports: never 0.0.0.0, never
    # loopback (a peer elsewhere would dial itself), a different host for each node
    logs = [(workdir / f"peer-{i}.log").read_text() for i in range(4)]
    control = [_announced(log, "listening on ") for log in logs]
    data = [_announced(log, "data plane up: ") for log in logs]
    for hosts, port in ((control, "7401"), (data, "7402")):
        assert all(h.split("/")[4] == port for h in hosts), hosts
        assert not any(h.startswith(("/ip4/0.", "/ip4/127.")) for h in hosts), hosts
        assert len({h.split("/")[2] for h in hosts}) == 4, hosts
    assert [c.split("/")[2] for c in control] == [d.split("/")[2] for d in data]

    ids = [
        next(
            line.split("control ")[1].split(" ")[0]
            for line in log.splitlines()
            if "listening on" in line
        )
        for log in logs
    ]
    for i in (1, 2, 3):
        assert "not reachable: no peer could dial us back" in logs[i]
        assert "relay slots held at" in logs[i]
    # every pair of NATed peers connected (the control plane measures every link): the cone
    # pair through a punched hole, the symmetric peer through a relay
    assert f"to {ids[2]}: holepunched" in logs[1] or f"to {ids[1]}: holepunched" in logs[2]
    for cone in (1, 2):
        assert f"to {ids[3]}: relayed" in logs[cone] or f"to {ids[cone]}: relayed" in logs[3]
    assert "holepunched" not in logs[3]

    _every_round_averaged(workdir, steps)

    # the control plane measured the emulated links (5.0 and 11.0 ms one way; a relayed one
    # crosses two), not loopback (~0.1 ms); its ping over a py-libp2p stream reads about 2x high
    # here (docs/benchmarks.md)
    published = [line for log in logs for line in log.splitlines() if "published plan" in line]
    assert published and "6 of 6 links measured" in published[-1], published
    low, high = published[-1].split("one-way delay ")[1].split(" ms")[0].split("-")
    assert float(low) > 4.0 and float(high) < 80.0, published[-1]


def _every_round_averaged(workdir: Path, steps: int) -> None:
    """Every worker's report of every step, under the newest plan that ran that step: averaged
    (a step a re-plan ran again counts under the newer plan only)."""
    newest: dict[int, dict[tuple[int, int], str]] = {}
    keys: dict[int, tuple[int, int]] = {}
    for i in range(4):
        for line in (workdir / f"metrics-{i}.jsonl").read_text().splitlines():
            report = json.loads(line)
            if report["type"] != "metrics":
                continue
            step, key = report["step"], (report["term"], report["epoch"])
            if key > keys.get(step, key):
                newest.pop(step, None)  # the step was re-run under a newer plan
            if key >= keys.get(step, key):
                keys[step] = key
                newest.setdefault(step, {})[(report["stage"], report["replica"])] = report[
                    "averaging"
                ]
    assert sorted(newest) == list(range(steps))
    for step, outcomes in newest.items():
        assert len(outcomes) == 4 and set(outcomes.values()) == {"averaged"}, (step, outcomes)


def _announced(log: str, marker: str) -> str:
    """The first address a node's log line starting at `marker` gives."""
    line = next(line for line in log.splitlines() if marker in line)
    return line.split(marker)[1].strip("[]' ").split("'")[0].split("/p2p/")[0]


def test_emulate_needs_a_valid_topology(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "p2ptrain", "local", "--emulate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "format must be" in proc.stderr
