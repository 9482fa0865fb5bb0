"""A restarted swarm whose nodes come back one at a time resumes every stage (issue 30's
residual): a first swarm of 2 nodes (one stage each, each in its own checkpoint directory)
trains steps 0..9 and stops; then the bootstrap and one node restart with `min_peers = 1`, and
the other node only STAGGER_S later. The first plan waits for the holder of the blocks nobody
present saved (control/planning/readiness.py: holder_gaps), so both stages resume at step 10,
where the lone node used to be planned alone at once and the absent stage started from initial
weights for good."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2ptrain import identity, procs
from p2ptrain.records import issue_token
from tests.conftest import processes_with
from tests.integration.local_runs import run_local, tiny_run_toml

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two swarms: about 2 minutes

STAGGER_S = 25.0  # well past the lone node's readiness (its own worker, no links to measure)


def test_a_swarm_restarted_one_node_at_a_time_resumes_every_stage(tmp_path: Path) -> None:
    first_dir = tmp_path / "first"
    run = tmp_path / "run.toml"  # no checkpoint_dir: each node keeps its own (peer-i/checkpoints)
    run.write_text(tiny_run_toml("staggered-restart", "checkpoint_interval = 5"))
    first = run_local(
        "--peers", "2", "--run", str(run), "--steps", "10", "--workdir", str(first_dir)
    )
    assert first["steps"] == 10 and [len(p) for p in first["plan"]["pipelines"]] == [2]
    for i in range(2):  # each node holds only its own stage
        assert (
            len({p.name.split(".")[0] for p in (first_dir / f"peer-{i}").rglob("*.step*.pt")}) == 1
        )

    second = tmp_path / "second"
    second.mkdir()
    again = tmp_path / "again.toml"
    again.write_text(tiny_run_toml("staggered-restart", "checkpoint_interval = 5", "steps = 20"))
    nodes = []
    try:
        boot = procs.spawn(
            [
                sys.executable,
                "-m",
                "p2ptrain",
                "bootstrap",
                "--identity",
                str(first_dir / "bootstrap.key"),
                "--run",
                str(again),
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
            ],
            log_path=second / "bootstrap.log",
            stdout=subprocess.PIPE,
            die_with_parent=signal.SIGTERM,
        )
        nodes.append(boot)
        assert boot.stdout is not None
        address = boot.stdout.readline().decode().strip()  # its first line: where to join
        assert address.startswith("/ip4/127.0.0.1/"), address
        organiser = identity.load_identity(first_dir / "bootstrap.key")
        for i in range(2):
            if i == 1:
                time.sleep(STAGGER_S)
            key = first_dir / f"peer-{i}.key"
            token = issue_token(
                organiser,
                identity.peer_id_of(identity.load_identity(key)),
                True,
                time.time() + 3600,
            ).encode()
            argv = [
                sys.executable,
                "-m",
                "p2ptrain",
                "join",
                "--bootstrap",
                address,
                "--identity",
                str(key),
                "--token",
                token,
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--data-listen",
                "/ip4/127.0.0.1/tcp/0",
                "--threads",
                "1",
                "--device",
                "cpu",
                "--checkpoint-dir",
                str(first_dir / f"peer-{i}" / "checkpoints"),
            ]
            log_path = second / f"peer-{i}.log"
            nodes.append(procs.spawn(argv, log_path=log_path, die_with_parent=signal.SIGTERM))
        deadline = time.monotonic() + 240
        while any(node.poll() is None for node in nodes[1:]):  # they leave once step 20 is done
            assert time.monotonic() < deadline, "the restarted swarm did not finish"
            time.sleep(0.5)
    finally:
        procs.stop_groups(nodes[::-1], 20.0)
    logs = {i: (second / f"peer-{i}.log").read_text() for i in range(2)}
    waited = "the first plan waits for the holder of blocks"
    assert any(waited in log for log in logs.values()), logs[0][-3000:]
    for i, log in logs.items():
        assert "resumed from step 10 (lineage " in log, (i, log[-3000:])
        assert "started fresh" not in log and "STAGE STATE LOST" not in log, (i, log[-3000:])
        assert not re.search(r"started from initial weights", log), (i, log[-3000:])
    assert not processes_with(str(first_dir)), "a process of the run is left"
